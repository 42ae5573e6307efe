// runtime/pipeline/pipeline.cpp: the split (measured on rank 0, or given), the stage's blocks, one step's schedule of
// forwards and backwards with their messages, evaluation through the stages, and the checkpoint gathers.
#include "runtime/pipeline/pipeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "comm/host_collectives.h"
#include "comm/mpi_check.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/hash.h"
#include "core/ops.h"
#include "layers/model_state.h"
#include "runtime/step/evaluate.h"
#include "runtime/step/measure_block.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

namespace {

// The clipping norm's and the f16 scaler's parts over the stages of this replica (one rank per stage:
// every replica of a stage holds the same averaged gradients).
class StageParts final : public GradientParts {
 public:
  explicit StageParts(MPI_Comm comm) : comm_(comm) {}
  void max(std::span<uint64_t> values) const override { comm::all_reduce(comm_, values, comm::HostOp::Max); }
  void sum(std::span<uint64_t> values) const override { comm::all_reduce(comm_, values, comm::HostOp::Sum); }

 private:
  MPI_Comm comm_;
};

json shape_json(const Shape& s) { return json(s.vec()); }
Shape shape_of(const json& j) {
  std::vector<int64_t> dims = j.get<std::vector<int64_t>>();
  return Shape(std::span<const int64_t>(dims.data(), dims.size()));
}

}  // namespace

Pipeline::Pipeline(comm::World& world, const TrainerOptions& o, Device device, Module& model, const DataInfo& info,
                   Watchdog& dog, const FaultInjection& inject)
    : world_(world),
      o_(o),
      device_(device),
      model_(model),
      dog_(dog),
      inject_(inject),
      grid_(StageGrid::of(world.rank(), world.size(), o.pipeline_stages)),
      schedule_(o.pipeline_schedule),
      recompute_(o.pipeline_recompute) {
  permanent_errors([&] {
    blocks_ = model_.blocks();
    RT_CHECK(
        !blocks_.empty(), "--pipeline-stages ", grid_.stages, ": the model (", model_.type_name(), ") is no ",
        "sequence of blocks to split into stages (give it a Sequential at the top, or implement Module::blocks())");
    RT_CHECK(static_cast<int>(blocks_.size()) >= grid_.stages, "--pipeline-stages ", grid_.stages,
             ": the model has only ", blocks_.size(), " blocks (each stage needs at least one)");
  });
  permanent_errors([&] { owners(); });  // before any work: a parameter no block holds
  MPI_CHECK(MPI_Comm_split(world_.comm(), grid_.stage, grid_.replica, &stage_comm_));
  MPI_CHECK(MPI_Comm_split(world_.comm(), grid_.replica, grid_.stage, &pipe_comm_));
  decide_split(o, info);
  keep_my_blocks();
  if (recompute_)
    for (const auto& [name, b] : buffers_) buffer_copies_.push_back(Tensor::empty(b.shape(), b.dtype(), device_));
  dog_.phase("startup: connecting the pipeline's stages (waiting for other ranks)", 0);
  forward_ = comm::make_channel(pipe_comm_, device_, "activations");
  backward_ = comm::make_channel(pipe_comm_, device_, "gradients");
  across_ = std::make_unique<StageParts>(pipe_comm_);
}

Pipeline::~Pipeline() = default;  // destructors never communicate: the communicators go with MPI

// Rank 0 measures every block once on one micro-batch (unless the split is given, when a no-gradient pass
// finds the shapes), decides the split, and tells everyone: the split, every block's output and its costs.
void Pipeline::decide_split(const TrainerOptions& o, const DataInfo& info) {
  std::string text, error;
  if (world_.is_root()) {
    dog_.phase("startup: measuring the model's blocks for the pipeline (rank 0)", 0);
    error = comm::failure_of([&] {
      const bool measure = o.pipeline_split.empty();
      // The measurement trains the blocks: their BatchNorm statistics, the generator and the gradients are
      // put back after it.
      std::optional<ModelStateGuard> untouched(std::in_place, model_);
      Tensor x = Tensor::zeros(Shape{o.batch, info.height, info.width, info.channels}, DType::F32, device_);
      std::vector<BlockCost> costs(blocks_.size());
      json outputs = json::array();
      for (size_t i = 0; i < blocks_.size(); ++i) {
        costs[i].name = blocks_[i].name;
        for (const auto& m : blocks_[i].modules)
          for (const auto& [n, p] : m->named_parameters()) costs[i].param_bytes += p.nbytes();
      }
      const int rounds = measure ? 3 : 1;
      std::vector<uint64_t> draws(blocks_.size(), 0);  // generator streams each block's forward takes (dropout)
      for (int round = 0; round < rounds; ++round) {
        Tensor prev = x;
        for (size_t i = 0; i < blocks_.size(); ++i) {
          Tensor y;
          const uint64_t stream_before = rng_stream();
          if (!measure) {
            NoGradGuard no_grad;
            AutocastGuard autocast(autocast_type(o.precision));
            y = blocks_[i].forward(prev.detach());
          } else {
            const BlockMeasure m = measure_block(blocks_[i], prev, i > 0, autocast_type(o.precision), device_, true);
            y = m.output;
            costs[i].backward_bytes = std::max(costs[i].backward_bytes, m.backward_peak);
            // The first round warms caches and plans; later ones are timed (the fastest counts).
            const double s = m.forward_s + m.backward_s;
            if (round == 1 || (round > 1 && s < costs[i].seconds)) costs[i].seconds = s;
            costs[i].activation_bytes = std::max(costs[i].activation_bytes, m.kept_bytes);
          }
          if (round == 0) {
            outputs.push_back({{"shape", shape_json(y.shape())}, {"dtype", dtype_name(y.dtype())}});
            draws[i] = rng_stream() - stream_before;
          }
          prev = y.detach();
        }
        model_.zero_grad();
      }
      untouched.reset();
      const int n = static_cast<int>(blocks_.size());
      PipelineSplit split;
      if (!measure) {
        split = parse_pipeline_split(o.pipeline_split, n, grid_.stages);
      } else if (o.pipeline_balance == PipelineBalance::Memory) {
        const double slots = o.optimizer == OptimizerKind::AdamW ? 2 : (o.momentum > 0 ? 1 : 0);
        for (size_t i = 0; i < costs.size(); ++i) {
          const json& out = outputs[i];
          int64_t numel = 1;
          for (const auto& d : out["shape"]) numel *= d.get<int64_t>();
          costs[i].output_bytes =
              numel * static_cast<int64_t>(dtype_size(parse_dtype(out["dtype"].get<std::string>())));
        }
        split = balance_memory(costs, grid_.stages, schedule_, static_cast<int>(o.accum), 2 + slots, recompute_);
      } else {
        split = balance_time(costs, grid_.stages);
      }
      json c = json::array();
      for (const auto& b : costs)
        c.push_back({{"name", b.name},
                     {"seconds", b.seconds},
                     {"param_bytes", b.param_bytes},
                     {"activation_bytes", b.activation_bytes},
                     {"backward_bytes", b.backward_bytes}});
      text = json{{"split", split}, {"outputs", outputs}, {"costs", c}, {"measured", measure}, {"draws", draws}}.dump();
    });
  } else {
    dog_.phase("startup: waiting for rank 0 to measure the model's blocks for the pipeline", 0);
  }
  comm::agree_or_throw(world_.comm(), error, "--pipeline-stages (splitting the model)", true);
  const json plan = json::parse(comm::broadcast(world_.comm(), text, 0));
  split_ = plan["split"].get<PipelineSplit>();
  // One process draws a step's generator streams micro-batch by micro-batch, block by block: a stage's
  // forward of micro-batch i starts at step_base + i x (all blocks' draws) + (the earlier stages' draws).
  const auto draws = plan["draws"].get<std::vector<uint64_t>>();
  for (size_t b = 0; b < draws.size(); ++b) {
    draws_per_micro_ += draws[b];
    if (static_cast<int>(b) < split_[static_cast<size_t>(grid_.stage)]) draws_before_ += draws[b];
  }
  for (const json& out : plan["outputs"])
    outputs_.push_back({shape_of(out["shape"]), parse_dtype(out["dtype"].get<std::string>())});
  for (const json& b : plan["costs"])
    costs_.push_back({b["name"].get<std::string>(), plan["measured"].get<bool>() ? b["seconds"].get<double>() : 0.0,
                      b["param_bytes"].get<int64_t>(),
                      plan["measured"].get<bool>() ? b["activation_bytes"].get<int64_t>() : 0});
}

// Which block holds each of the model's parameters and buffers. Errors: one that none holds, or two.
std::map<const TensorImpl*, int> Pipeline::owners() const {
  std::map<const TensorImpl*, int> owner;
  for (size_t b = 0; b < blocks_.size(); ++b)
    for (const auto& m : blocks_[b].modules)
      for (const Named& part : {m->named_parameters(), m->named_buffers()})
        for (const auto& [n, t] : part) {
          const auto [it, fresh] = owner.emplace(t.impl(), static_cast<int>(b));
          RT_CHECK(fresh || it->second == static_cast<int>(b), "--pipeline-stages: '", n, "' is in two blocks (",
                   blocks_[static_cast<size_t>(it->second)].name, " and ", blocks_[b].name,
                   "): a weight shared between blocks cannot live on one stage");
        }
  for (const Named& part : {model_.named_parameters(), model_.named_buffers()})
    for (const auto& [name, t] : part)
      RT_CHECK(owner.count(t.impl()), "--pipeline-stages: '", name, "' of the model (", model_.type_name(),
               ") belongs to none of its blocks() (every parameter and buffer must be in one, or no stage holds it)");
  return owner;
}

// This stage's blocks' parameters and buffers (by the model's own names) are kept; the others' released.
void Pipeline::keep_my_blocks() {
  const std::map<const TensorImpl*, int> owner = owners();
  const int first = split_[static_cast<size_t>(grid_.stage)], end = split_[static_cast<size_t>(grid_.stage) + 1];
  auto sort_out = [&](const Named& all, Named& mine) {
    for (const auto& [name, t] : all) {
      const auto it = owner.find(t.impl());
      if (it->second >= first && it->second < end)
        mine.emplace_back(name, t);
      else
        Tensor(t).release();
    }
  };
  sort_out(model_.named_parameters(), params_);
  sort_out(model_.named_buffers(), buffers_);
  // What the other stages' weights took goes back to the system now, before the gradients, optimizer
  // state and activations of this stage are allocated (else the heap's holes would count on top of them).
  empty_cache(device_);
  if (device_.is_cuda()) empty_cache(Device::cpu());
}

ReplicaScope Pipeline::scope() const {
  ReplicaScope s;
  s.comm = stage_comm_;
  s.parameters = &params_;
  s.buffers = &buffers_;
  s.across = across_.get();
  s.bucket_plan_of = [this](uint64_t mine) { return combined_bucket_plan(mine); };
  return s;
}

// Each stage has its own buckets: the check-in compares one hash of every stage's (their first replicas'),
// and a rank whose plan differs from its stage's first replica's differs from rank 0's hash too.
uint64_t Pipeline::combined_bucket_plan(uint64_t mine) const {
  const std::vector<int64_t> all =
      comm::all_gather(world_.comm(), std::span<const int64_t>(reinterpret_cast<const int64_t*>(&mine), 1));
  Fnv1a h;
  for (int s = 0; s < grid_.stages; ++s)
    h.add_word(static_cast<uint64_t>(all[static_cast<size_t>(grid_.rank_of(s, 0))]));
  return h.value() ^ mine ^ static_cast<uint64_t>(all[static_cast<size_t>(grid_.rank_of(grid_.stage, 0))]);
}

json Pipeline::plan() const {
  json stages = json::array();
  for (int s = 0; s < grid_.stages; ++s) {
    json blocks = json::array();
    double secs = 0;
    int64_t params = 0, acts = 0;
    for (int b = split_[static_cast<size_t>(s)]; b < split_[static_cast<size_t>(s) + 1]; ++b) {
      const BlockCost& c = costs_[static_cast<size_t>(b)];
      blocks.push_back(c.name);
      secs += c.seconds;
      params += c.param_bytes;
      acts += c.activation_bytes;
    }
    stages.push_back({{"blocks", blocks},
                      {"seconds", secs},
                      {"param_bytes", params},
                      {"activation_bytes_per_micro_batch", acts},
                      {"micro_batches_in_flight", in_flight(schedule_, grid_.stages, s, static_cast<int>(o_.accum))}});
  }
  return json{{"stages", grid_.stages},
              {"replicas", grid_.replicas},
              {"schedule", name_of(schedule_)},
              {"balance", o_.pipeline_split.empty() ? name_of(o_.pipeline_balance) : "given"},
              {"split", split_text(split_)},
              {"micro_batches", o_.accum},
              {"recompute", recompute_},
              {"ideal_bubble", ideal_bubble(grid_.stages, static_cast<int>(o_.accum))},
              {"stage", stages}};
}

std::string Pipeline::describe() const {
  const json p = plan();
  std::string out =
      detail::str_cat("pipeline: ", grid_.stages, " stages x ", grid_.replicas, " replica(s), ", name_of(schedule_),
                      ", ", o_.accum, " micro-batches per step, split ", split_text(split_), " (",
                      p["balance"].get<std::string>(), ")", recompute_ ? ", forwards recomputed in backward" : "");
  for (int s = 0; s < grid_.stages; ++s) {
    const json& st = p["stage"][static_cast<size_t>(s)];
    out += detail::str_cat("\n  stage ", s, ": ", st["blocks"].size(), " block(s) ",
                           st["blocks"].front().get<std::string>(), "..", st["blocks"].back().get<std::string>(), ", ",
                           format_bytes(st["param_bytes"].get<int64_t>()), " of parameters");
    if (costs_.front().seconds > 0 || costs_.back().seconds > 0)
      out += detail::str_cat(
          ", ", std::lround(st["seconds"].get<double>() * 1e4) / 10.0, " ms and ",
          format_bytes(st["activation_bytes_per_micro_batch"].get<int64_t>()), " of activations a micro-batch (",
          recompute_
              ? detail::str_cat("recomputed block by block, inputs of ", st["micro_batches_in_flight"].get<int>())
              : detail::str_cat(st["micro_batches_in_flight"].get<int>()),
          " in flight)");
  }
  return out;
}

Tensor Pipeline::run_blocks(const Tensor& x) const {
  Tensor y = x;
  for (int b = split_[static_cast<size_t>(grid_.stage)]; b < split_[static_cast<size_t>(grid_.stage) + 1]; ++b)
    y = blocks_[static_cast<size_t>(b)].forward(y);
  return y;
}

Shape Pipeline::with_batch(const Boundary& b, int64_t n) const {
  Shape s = b.shape;
  s[0] = n;
  return s;
}

// drop_path's keying of micro-batch m (core/ops.h sample_draws): its samples' place in the step's global batch
// (the sampler deals micro-batch m's samples to the replicas in order) and where the whole model's forward of m
// began in the generator, the stages before this one included.
SampleDraws Pipeline::micro_draws(int64_t step, int m, uint64_t step_stream) const {
  return {.set = true,
          .step = static_cast<uint64_t>(step),
          .first_sample = (static_cast<int64_t>(m) * grid_.replicas + grid_.replica) * o_.batch,
          .micro_origin = step_stream + static_cast<uint64_t>(m) * draws_per_micro_};
}

Pipeline::StepWork Pipeline::run_step(Replica& replica, int64_t step, const std::function<data::Batch()>& next_batch,
                                      const std::function<void(int, double)>& on_loss, Trace& trace) {
  const int m = static_cast<int>(o_.accum), s = grid_.stage;
  const Boundary* in = grid_.first() ? nullptr : &outputs_[static_cast<size_t>(split_[static_cast<size_t>(s)] - 1)];
  const Boundary& out = outputs_[static_cast<size_t>(split_[static_cast<size_t>(s) + 1] - 1)];
  std::vector<Tensor> inputs(static_cast<size_t>(m)), outputs(static_cast<size_t>(m)), losses(static_cast<size_t>(m)),
      labels(static_cast<size_t>(m));
  std::vector<comm::WorkPtr> sends;
  std::vector<uint64_t> rng_at(static_cast<size_t>(m), 0);
  const uint64_t step_stream = rng_stream();  // the same on every rank: each step ends where one process's does
  StepWork w;
  // What the schedule keeps alive: memory held above the step's start, sampled after every forward.
  const int64_t start_bytes = memory_stats(device_).allocated_bytes;
  const auto where = [&](const char* what, int micro, int peer_stage) {
    return detail::str_cat("stage ", s, ", micro-batch ", micro,
                           peer_stage < 0 ? ""
                                          : detail::str_cat(", ", what, " stage ", peer_stage, " (rank ",
                                                            grid_.rank_of(peer_stage, grid_.replica), ")"));
  };
  for (const PipelineOp& op : pipeline_order(schedule_, grid_.stages, s, m)) {
    const auto i = static_cast<size_t>(op.micro);
    if (op.kind == PipelineOp::Forward) {
      Tensor x;
      if (reads_data()) {
        const auto t = Clock::now();
        dog_.phase("data loading", step, where("", op.micro, -1));
        data::Batch b = next_batch();
        w.data_wait_s += seconds(Clock::now() - t);
        if (grid_.first()) x = b.images;
        if (grid_.last()) labels[i] = b.labels;
      }
      if (!grid_.first()) {
        x = Tensor::empty(in->shape, in->dtype, device_);
        dog_.phase("pipeline: waiting for a micro-batch's activations", step, where("from", op.micro, s - 1));
        const auto t = Clock::now();
        forward_->recv(x, s - 1)->wait();
        w.wait_s += seconds(Clock::now() - t);
        x.set_requires_grad(true);
      }
      dog_.phase("forward", step, where("", op.micro, -1));
      const auto t0 = Clock::now();
      Tensor y;
      {
        // --pipeline-recompute: nothing kept for the backward but the stage's input (and where the generator
        // stood, so dropout draws the same masks again).
        std::optional<NoGradGuard> keep_nothing;
        if (recompute_) keep_nothing.emplace();
        rng_at[i] = step_stream + i * draws_per_micro_ + draws_before_;
        set_rng_stream(rng_at[i]);
        set_sample_draws(micro_draws(step, op.micro, step_stream));
        AutocastGuard autocast(replica.autocast());
        y = run_blocks(x);
        if (grid_.last()) losses[i] = replica.loss_of(y, labels[i]);
      }
      if (grid_.last()) on_loss(op.micro, losses[i].item());
      const auto t1 = Clock::now();
      w.forward_s += seconds(t1 - t0);
      trace.span(detail::str_cat("forward ", op.micro), t0, t1, step);
      if (!grid_.last()) {
        RT_CHECK(y.shape() == out.shape && y.dtype() == out.dtype, "pipeline stage ", s, ": micro-batch ", op.micro,
                 " gave ", y.describe(), " where the split's measurement gave ", dtype_name(out.dtype), out.shape.str(),
                 " (a block whose output shape depends on its input's values?)");
        sends.push_back(forward_->send(y, s + 1));  // the send keeps y alive until it is taken
        if (!recompute_) outputs[i] = y;
      }
      inputs[i] = x;
      w.held_bytes = std::max(w.held_bytes, memory_stats(device_).allocated_bytes - start_bytes);
      inject_.after_forward(world_.rank(), step, op.micro);
      continue;
    }
    const bool last_micro = op.micro == m - 1;
    Tensor g;
    if (!grid_.last()) {
      g = Tensor::empty(out.shape, out.dtype, device_);
      dog_.phase("pipeline: waiting for a micro-batch's gradient", step, where("from", op.micro, s + 1));
      const auto t = Clock::now();
      backward_->recv(g, s + 1)->wait();
      w.wait_s += seconds(Clock::now() - t);
    }
    dog_.phase("backward", step, where("", op.micro, -1));
    const auto t2 = Clock::now();
    if (recompute_) {
      set_sample_draws(micro_draws(step, op.micro, step_stream));
      recomputed_backward(replica, inputs[i], rng_at[i], labels[i], g, last_micro, w, start_bytes);
    } else if (grid_.last())
      replica.backward(losses[i], last_micro);
    else
      replica.backward_from(outputs[i], g, last_micro);
    const auto t3 = Clock::now();
    w.backward_s += seconds(t3 - t2);
    w.backward_start = t2;
    w.backward_end = t3;
    trace.span(detail::str_cat("backward ", op.micro), t2, t3, step);
    if (!grid_.first()) sends.push_back(backward_->send(inputs[i].grad(), s - 1));
    inputs[i] = outputs[i] = losses[i] = labels[i] = Tensor();
  }
  dog_.phase("pipeline: waiting for this step's messages to be taken", step,
             detail::str_cat("stage ", s, ", by stage ", s - 1, " and ", s + 1));
  for (auto& send : sends) send->wait();
  set_rng_stream(step_stream + static_cast<uint64_t>(m) * draws_per_micro_);
  w.busy_s = w.forward_s + w.backward_s;
  interval_.busy_s += w.busy_s;
  interval_.held_bytes = std::max(interval_.held_bytes, w.held_bytes);
  return w;
}

json Pipeline::interval_report(int64_t steps) {
  const auto n = static_cast<double>(std::max<int64_t>(1, steps));
  const std::vector<double> busy = per_stage(interval_.busy_s / n);
  const std::vector<double> step = per_stage(interval_.step_s / n);
  const std::vector<double> held = per_stage(static_cast<double>(interval_.held_bytes));
  interval_ = {};
  json bubble = json::array();
  for (size_t s = 0; s < busy.size(); ++s) bubble.push_back(step[s] > 0 ? 1.0 - busy[s] / step[s] : 0.0);
  return json{{"busy_s", busy},
              {"bubble", bubble},
              {"activation_bytes", held},
              {"ideal_bubble", ideal_bubble(grid_.stages, static_cast<int>(o_.accum))}};
}

// --pipeline-recompute: the stage's forward again, block by block. A pass without gradients keeps each
// block's input; then from the last block back, each block runs once more keeping its activations and its
// backward follows at once, handing its input's gradient to the block before. So the stage holds its
// blocks' inputs and one block's activations, not all of them. The same inputs, weights and generator
// positions give the same bits, and each parameter's gradient comes from its one block as in the whole
// backward: the gradients are those of the run without recompute. The BatchNorm running statistics the
// two passes would update again are put back as they were, so they move once per micro-batch.
void Pipeline::recomputed_backward(Replica& replica, const Tensor& input, uint64_t rng_at, const Tensor& labels,
                                   const Tensor& grad, bool last_micro, StepWork& w, int64_t start_bytes) {
  const auto t0 = Clock::now();
  const int first = split_[static_cast<size_t>(grid_.stage)], end = split_[static_cast<size_t>(grid_.stage) + 1];
  const auto n = static_cast<size_t>(end - first);
  // The running statistics the two passes would move again, and the generator, are put back at the end.
  std::vector<Tensor> buffers;
  for (const auto& [name, b] : buffers_) buffers.push_back(b);
  ModelStateGuard untouched(std::move(buffers), &buffer_copies_);
  AutocastGuard autocast(replica.autocast());
  std::vector<Tensor> x(n);
  std::vector<uint64_t> at(n);
  x[0] = input;
  set_rng_stream(rng_at);
  {
    NoGradGuard no_grad;
    for (size_t j = 0; j + 1 < n; ++j) {
      at[j] = rng_stream();
      x[j + 1] = blocks_[static_cast<size_t>(first) + j].forward(x[j]);
    }
  }
  at[n - 1] = rng_stream();
  w.recompute_s += seconds(Clock::now() - t0);
  Tensor g = grad;
  for (size_t j = n; j-- > 0;) {
    const auto t1 = Clock::now();
    if (j > 0) x[j].set_requires_grad(true);
    set_rng_stream(at[j]);
    Tensor y = blocks_[static_cast<size_t>(first) + j].forward(x[j]);
    Tensor loss;
    if (grid_.last() && j == n - 1) loss = replica.loss_of(y, labels);
    w.recompute_s += seconds(Clock::now() - t1);
    w.held_bytes = std::max(w.held_bytes, memory_stats(device_).allocated_bytes - start_bytes);
    if (loss.defined())
      replica.backward(loss, last_micro);
    else
      replica.backward_from(y, g, last_micro);
    if (j > 0) g = x[j].grad();
    x[j] = Tensor();
  }
}

EvalResult Pipeline::evaluate(data::Loader* loader, int64_t test_size, const EvalOptions& options, int64_t step) {
  const int s = grid_.stage;
  RT_CHECK(!options.logits, "pipeline evaluation: a custom logits function (EvalOptions::logits) sees the whole ",
           "model, which no stage holds; the stages' blocks give the logits");
  const auto batches = eval_share(test_size, grid_.replica, grid_.replicas, options);
  if (reads_data()) loader->start(batches, options.epoch);
  EvalScope scope(model_);
  EvalSums sums = options.classes > 0 ? EvalSums(options.classes) : EvalSums();
  CrossEntropyLoss loss_fn({.label_smoothing = options.label_smoothing, .ignore_index = options.ignore_index});
  // Evaluation runs without autocast, as it does without stages: every boundary is f32.
  const Boundary* in = grid_.first() ? nullptr : &outputs_[static_cast<size_t>(split_[static_cast<size_t>(s)] - 1)];
  std::vector<comm::WorkPtr> sends;
  for (size_t k = 0; k < batches.size(); ++k) {
    const auto valid =
        static_cast<int64_t>(std::count_if(batches[k].begin(), batches[k].end(), [](int64_t i) { return i >= 0; }));
    std::optional<data::Batch> b;
    if (options.on_batch) options.on_batch();  // as evaluate() does; the phase below says more
    if (reads_data()) {
      dog_.phase("evaluation", step, detail::str_cat("stage ", s, ", batch ", k));
      b = loader->next();
      RT_CHECK(b.has_value(), "pipeline evaluation: the test loader ended after ", k, " of ", batches.size(),
               " batches");
    }
    if (valid == 0) continue;
    Tensor x;
    if (grid_.first()) {
      x = b->images.slice(0, valid);
    } else {
      x = Tensor::empty(with_batch(*in, valid), DType::F32, device_);
      dog_.phase("pipeline: waiting for a test batch's activations", step,
                 detail::str_cat("stage ", s, ", batch ", k, ", from stage ", s - 1));
      forward_->recv(x, s - 1)->wait();
    }
    dog_.phase("evaluation", step, detail::str_cat("stage ", s, ", batch ", k));
    Tensor y = run_blocks(x);
    if (grid_.last())
      sums.score(y, b->labels.slice(0, valid), loss_fn);
    else
      sends.push_back(forward_->send(y, s + 1));
  }
  if (options.on_wait) options.on_wait();
  dog_.phase("evaluation all-reduce (waiting for other ranks)", step);
  for (auto& send : sends) send->wait();
  return sums.total(world_.comm());
}

Pipeline::Named Pipeline::gather_model() {
  Named mine = params_;
  mine.insert(mine.end(), buffers_.begin(), buffers_.end());
  Named all = gather_optimizer(mine);
  if (all.empty()) return all;
  // In the model's own order, as Module::state_dict() gives it without stages.
  std::map<std::string, Tensor> by_name(all.begin(), all.end());
  Named ordered;
  for (const auto& [name, t] : model_.state_dict()) {
    const auto it = by_name.find(name);
    RT_CHECK(it != by_name.end(), "pipeline checkpoint: no stage holds '", name, "' of the model");
    ordered.emplace_back(name, it->second);
  }
  return ordered;
}

// Every stage's replica 0 sends its part to world rank 0, which merges them (a "step" entry once).
Pipeline::Named Pipeline::gather_optimizer(const Named& part) {
  if (grid_.replica != 0) return {};
  if (grid_.stage != 0) {
    comm::send_named(pipe_comm_, part, 0);
    return {};
  }
  // Every stage's entries in stage order (the model's parameter order); an entry every stage has (the
  // optimizer's "step") once, where the first stage has it.
  Named all = part;
  const bool shared_last = !part.empty();
  const std::string last_name = shared_last ? part.back().first : "";
  std::optional<std::pair<std::string, Tensor>> shared;
  for (int s = 1; s < grid_.stages; ++s)
    for (auto& [name, t] : comm::recv_named(pipe_comm_, s)) {
      const bool seen = std::any_of(all.begin(), all.end(), [&](const auto& e) { return e.first == name; });
      if (!seen)
        all.emplace_back(std::move(name), std::move(t));
      else if (name == last_name)
        shared.emplace(name, t);
    }
  if (shared) {  // the first stage's last entry is every stage's: last again
    const auto it = std::find_if(all.begin(), all.end(), [&](const auto& e) { return e.first == last_name; });
    auto entry = *it;
    all.erase(it);
    all.push_back(std::move(entry));
  }
  return all;
}

std::vector<double> Pipeline::per_stage(double value) const {
  std::vector<double> all(static_cast<size_t>(world_.size()));
  MPI_CHECK(MPI_Allgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, world_.comm()));
  std::vector<double> out;
  for (int s = 0; s < grid_.stages; ++s) out.push_back(all[static_cast<size_t>(grid_.rank_of(s, 0))]);
  return out;
}

void Pipeline::close() {
  forward_->close();
  backward_->close();
  MPI_CHECK(MPI_Comm_free(&stage_comm_));
  MPI_CHECK(MPI_Comm_free(&pipe_comm_));
}

}  // namespace ringtrain::runtime
