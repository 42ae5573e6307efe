// runtime/layout/layout_probe.cpp: the planner's measurements and --layout auto (layout_probe.h).
#include "runtime/layout/layout_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <span>

#include "comm/host_collectives.h"
#include "comm/mpi_check.h"
#include "core/autocast.h"
#include "core/check.h"
#include "core/ops.h"
#include "io/files.h"
#include "layers/checkpoint.h"
#include "layers/loss.h"
#include "layers/model_state.h"
#include "optim/optimizer.h"
#include "runtime/memory/memory_plan.h"

namespace ringtrain::runtime {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double since(Clock::time_point t) { return seconds(Clock::now() - t); }
}  // namespace

int64_t layout_global_batch(const TrainerOptions& o, int world_size) {
  if (o.global_batch > 0) return o.global_batch;
  if (o.batch <= 0)
    RT_THROW_PERMANENT("--layout auto with -b auto: give the global batch to split (--global-batch N, or -b N for N ",
                       "images a rank)");
  return o.batch * world_size * o.accum;
}

std::pair<int64_t, int64_t> probe_batches(int64_t global_batch, int world_size) {
  const int64_t hi = std::max<int64_t>(1, global_batch / std::max(1, world_size));
  const int64_t lo = std::max<int64_t>(1, hi / 4);
  return {lo == hi ? std::max<int64_t>(1, hi / 2) : lo, lo == hi && hi == 1 ? 2 : hi};
}

ComputeProfile measure_compute(const TrainerOptions& o, Device device, Module& model, const DataInfo& info,
                               int64_t b0, int64_t b1) {
  RT_CHECK(b0 >= 1 && b1 > b0, "the layout probe: micro-batches ", b0, " and ", b1);
  std::vector<Block> blocks = model.blocks();
  if (blocks.empty()) blocks.push_back({"model", {}, [&model](const Tensor& x) { return model.forward(x); }, {}});
  ComputeProfile p;
  p.batch[0] = b0, p.batch[1] = b1;
  p.blocks.resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    p.blocks[i].name = blocks[i].name;
    for (const auto& m : blocks[i].modules)
      for (const auto& [n, t] : m->named_parameters())
        if (t.requires_grad()) p.blocks[i].param_bytes += t.nbytes();
    p.blocks[i].recomputable = i + 1 < blocks.size() && blocks.size() > 1;
  }
  if (blocks.size() == 1 && blocks[0].modules.empty())
    for (const auto& [n, t] : model.named_parameters())
      if (t.requires_grad()) p.blocks[0].param_bytes += t.nbytes();
  // The probe trains: BatchNorm statistics, the generator's stream and the gradients go back after it.
  std::optional<ModelStateGuard> untouched(std::in_place, model);
  const CrossEntropyLoss loss_fn(o.label_smoothing);
  const std::optional<DType> half = autocast_type(o.precision);
  // Round 0 warms (plans, caches, oneDNN's primitives); the fastest of the later ones counts.
  constexpr int kRounds = 3;
  for (int round = 0; round < kRounds; ++round)
    for (int k = 0; k < 2; ++k) {
      const int64_t b = p.batch[k];
      Tensor x = Tensor::normal(Shape{b, info.height, info.width, info.channels}, 0, 1, 17 + round, DType::F32, device);
      const Tensor labels = Tensor::zeros(Shape{b}, DType::I64, device);
      Tensor prev = x;
      for (size_t i = 0; i < blocks.size(); ++i) {
        Tensor in = prev.detach();
        if (i > 0) in.set_requires_grad(true);
        const auto t0 = Clock::now();
        Tensor y;
        {
          AutocastGuard autocast(half);
          y = blocks[i].forward(in);
        }
        synchronize(device);
        const double f = since(t0);
        const auto t1 = Clock::now();
        if (i + 1 == blocks.size()) {
          Tensor loss = loss_fn(y, labels);
          loss.backward();
        } else if (y.requires_grad()) {
          y.backward(Tensor::ones(y.shape(), y.dtype(), device));
        }
        for (const auto& m : blocks[i].modules) m->zero_grad(true);
        synchronize(device);
        const double g = since(t1);
        BlockProfile& bp = p.blocks[i];
        if (round == 1 || (round > 1 && f < bp.forward[k])) bp.forward[k] = f;
        if (round == 1 || (round > 1 && g < bp.backward[k])) bp.backward[k] = g;
        if (round == 0 && k == 0 && b > 0) bp.output_bytes_per_image = y.nbytes() / b;
        prev = y.detach();
      }
      model.zero_grad();
    }
  untouched.reset();
  // The optimizer's update over copies of the parameters (the run's rule), the fastest of three.
  std::vector<NamedParameter> copies;
  int64_t bytes = 0;
  for (const auto& [n, t] : model.named_parameters())
    if (t.requires_grad()) {
      Tensor c = t.detach().clone();
      c.set_requires_grad(true);
      c.set_grad(Tensor::zeros(t.shape(), t.dtype(), device));
      copies.push_back({n, c});
      bytes += t.nbytes();
    }
  if (bytes > 0) {
    std::unique_ptr<Optimizer> opt;
    if (o.optimizer == OptimizerKind::Sgd)
      opt = std::make_unique<Sgd>(copies, SgdOptions{.momentum = o.momentum, .nesterov = o.nesterov, .weight_decay = o.wd});
    else
      opt = std::make_unique<AdamW>(copies, AdamWOptions{.weight_decay = o.wd});
    double best = 0;
    for (int i = 0; i < 4; ++i) {
      const auto t0 = Clock::now();
      opt->step(1e-3);
      synchronize(device);
      const double s = since(t0);
      if (i == 1 || (i > 1 && s < best)) best = s;
    }
    p.optimizer_seconds_per_byte = best / static_cast<double>(bytes);
  }
  return p;
}

namespace {

// This rank's host among the world's, numbered in rank order.
int host_index(const comm::World& world) {
  std::vector<std::string> seen;
  for (const std::string& h : world.hosts())
    if (std::find(seen.begin(), seen.end(), h) == seen.end()) seen.push_back(h);
  return static_cast<int>(std::find(seen.begin(), seen.end(), world.host()) - seen.begin());
}

// Median seconds of an all-reduce of `bytes` on `comm` (one warm-up, then `reps`).
double time_allreduce(comm::Communicator& c, Device device, int64_t bytes, int reps) {
  Tensor t = Tensor::ones(Shape{bytes / 4}, DType::F32, device);
  std::vector<double> times;
  for (int i = 0; i <= reps; ++i) {
    const auto t0 = Clock::now();
    c.all_reduce_async(t, comm::ReduceOp::Sum)->wait();
    synchronize(device);
    if (i > 0) times.push_back(since(t0));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::pair<double, double> fit_group(MPI_Comm group, int n, comm::Backend backend, Device device) {
  comm::CommunicatorPtr c = comm::make_communicator(backend, group);
  std::vector<std::pair<int64_t, double>> samples;
  for (int64_t bytes : {int64_t{64} << 10, int64_t{1} << 20, int64_t{4} << 20}) {
    const double t = time_allreduce(*c, device, bytes, 3);
    // The slowest member's time is the collective's.
    samples.push_back({bytes, comm::all_reduce(group, t, comm::HostOp::Max)});
  }
  return fit_ring(samples, n);
}

}  // namespace

LinkModel measure_link(comm::World& world, Device device) {
  LinkModel link;
  const comm::Backend backend = device.is_cuda() ? comm::Backend::Nccl : comm::Backend::Ring;
  MPI_Comm local = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(world.comm(), host_index(world), world.rank(), &local));
  double intra[2] = {0, 0};  // alpha, 1/bw: the slowest host's
  if (world.local_size() > 1) {
    const auto [a, bw] = fit_group(local, world.local_size(), backend, device);
    intra[0] = a, intra[1] = 1 / bw;
  }
  comm::all_reduce(world.comm(), std::span<double>(intra, 2), comm::HostOp::Max);
  if (intra[0] > 0) link.alpha_intra = intra[0], link.bw_intra = 1 / intra[1];
  double inter[2] = {0, 0};
  if (world.num_nodes() > 1) {
    MPI_CHECK(MPI_Comm_split(world.comm(), world.local_rank() == 0 ? 0 : MPI_UNDEFINED, world.rank(), &leaders));
    if (leaders != MPI_COMM_NULL) {
      const auto [a, bw] = fit_group(leaders, world.num_nodes(), backend, device);
      inter[0] = a, inter[1] = 1 / bw;
    }
    comm::all_reduce(world.comm(), std::span<double>(inter, 2), comm::HostOp::Max);
    link.alpha_inter = inter[0], link.bw_inter = 1 / inter[1];
  } else {
    // One host: nothing crosses hosts; the figures stand in for a host link never used.
    link.alpha_inter = link.alpha_intra, link.bw_inter = link.bw_intra;
  }
  if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
  MPI_Comm_free(&local);
  link.source = detail::str_cat("measured at start-up (", world.num_nodes(), " host(s), ", world.local_size(),
                                " rank(s) each)");
  return link;
}

LinkModel read_link_file(const std::string& path) {
  io::require_regular_file(path, "--link-calibration");
  std::ifstream in(path);
  RT_CHECK(in.good(), "--link-calibration: cannot read '", path, "'");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    RT_THROW("--link-calibration '", path, "': not JSON (", e.what(), ")");
  }
  return LinkModel::from_json(j.contains("link") ? j["link"] : j, detail::str_cat("--link-calibration '", path, "'"));
}

namespace {

struct Timings {
  Clock::time_point start = Clock::now();
  double compute = 0, memory = 0, link = 0;
};

// Collective: the plan's input measured on every rank (memory facts with and without recompute, the budget,
// every block's compute at the micro-batches a world of `target` uses, the link), the slowest rank's compute
// and the smallest budget. The world's shape is `target`'s.
PlanInput gather_plan_input(comm::World& world, const TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                            DataSource& data, const StepFn& step_fn, const WorldShape& target, Timings& took) {
  const int W = target.size();
  const int64_t G = permanent_errors([&] { return layout_global_batch(o, W); });
  const DataInfo& info = data.info();
  PlanInput in;
  in.world = target;
  in.global_batch = G;
  in.options = o;
  in.backends = backends_for(in.world);
  in.max_stages = step_fn ? 1 : 8;
  if (o.backend) in.backends = {*o.backend};
  std::string error;
  // Memory: the facts without recompute and, when the model can, the activations with it; the smallest
  // budget and the largest facts over the ranks. Measured twice: first to cap the compute probe's batch, then
  // after it, as fit()'s memory plan will find the process (the probe's heap stays resident on the CPU).
  if (!o.link_calibration.empty()) {
    try {
      const auto t0 = Clock::now();
      in.link = read_link_file(o.link_calibration);
      took.link = since(t0);
    } catch (const std::exception& e) {
      error = e.what();
    }
    comm::agree_or_throw(world.comm(), error, "--layout auto (--link-calibration)", true);
  }
  RankBudget budget;
  auto probe_memory = [&] {
    dog.phase("startup: --layout auto (the memory probe)", 0);
    try {
      const auto t0 = Clock::now();
      TrainerOptions plain = o;
      plain.recompute = false;
      recompute_blocks(model, false);
      in.facts = measure_memory_facts(plain, device, model, data, step_fn);
      int marked = 0;
      try {
        marked = recompute_blocks(model, true);
      } catch (const std::exception&) {
        marked = 0;  // no sequence of blocks: recompute is no lever here
      }
      if (marked > 0) {
        TrainerOptions r = plain;
        r.recompute = true;
        in.recompute_curve = probe_activations(r, device, model, info, step_fn);
        recompute_blocks(model, false);
      }
      budget = rank_budget_of(o, world, device);
      took.memory += since(t0);
    } catch (const std::exception& e) {
      error = e.what();
    }
    comm::agree_or_throw(world.comm(), error, "--layout auto (the memory probe)", true);
    int64_t facts[7] = {in.facts.baseline, in.facts.peak_so_far, in.facts.curve.fixed, in.facts.curve.per_image,
                        in.recompute_curve ? in.recompute_curve->fixed : 0,
                        in.recompute_curve ? in.recompute_curve->per_image : 0, -budget.bytes};
    comm::all_reduce(world.comm(), std::span<int64_t>(facts, 7), comm::HostOp::Max);
    in.facts.baseline = facts[0], in.facts.peak_so_far = facts[1];
    in.facts.curve.fixed = facts[2], in.facts.curve.per_image = facts[3];
    if (in.recompute_curve) in.recompute_curve = ActivationCurve{facts[4], facts[5]};
    in.budget = -facts[6];
    in.budget_source = budget.source;
  };
  probe_memory();
  // Compute: every rank at once (so the contention of the run is in it), the slowest rank's figures.
  dog.phase("startup: --layout auto (measuring the model's blocks)", 0);
  try {
    // At most the micro-batch the budget holds without recompute (a probe over it would raise the run's peak).
    auto [b0, b1] = probe_batches(G, W);
    TrainerOptions v = o;
    v.recompute = false, v.pipeline_stages = 1, v.zero = 0;
    while (b1 > 2 && in.budget > 0 && !fits(predict_peak((v.batch = b1, v), in.facts, W).total, in.budget)) b1 /= 2;
    b0 = std::min(b0, std::max<int64_t>(1, b1 / 4));
    if (b0 >= b1) b0 = std::max<int64_t>(1, b1 / 2), b1 = std::max<int64_t>(b1, b0 + 1);
    const auto t0 = Clock::now();
    in.compute = measure_compute(o, device, model, info, b0, b1);
    took.compute = since(t0);
  } catch (const std::exception& e) {
    error = e.what();
  }
  comm::agree_or_throw(world.comm(), error, "--layout auto (measuring the model)", true);
  probe_memory();
  std::vector<double> times;
  for (const auto& b : in.compute.blocks)
    times.insert(times.end(), {b.forward[0], b.forward[1], b.backward[0], b.backward[1]});
  times.push_back(in.compute.optimizer_seconds_per_byte);
  comm::all_reduce(world.comm(), std::span<double>(times), comm::HostOp::Max);
  for (size_t i = 0; i < in.compute.blocks.size(); ++i) {
    BlockProfile& b = in.compute.blocks[i];
    b.forward[0] = times[4 * i], b.forward[1] = times[4 * i + 1];
    b.backward[0] = times[4 * i + 2], b.backward[1] = times[4 * i + 3];
  }
  in.compute.optimizer_seconds_per_byte = times.back();
  in.compute.source = detail::str_cat("measured on ", world.size(), " rank(s) at once, the slowest rank's");
  // The link: measured now, unless a calibration file (read first) gives it.
  if (o.link_calibration.empty() && world.size() > 1) {
    dog.phase("startup: --layout auto (measuring the links)", 0);
    const auto t0 = Clock::now();
    in.link = measure_link(world, device);
    took.link = since(t0);
  }
  return in;
}

// Rank 0: plans `in`, prints the table and the choice, and returns the plan record's "layout"; errors
// (nothing fits) pass through.
json plan_and_print(const PlanInput& in, const TrainerOptions& o, const Timings& took) {
  const LayoutPlan plan = plan_layouts(in);
  const double planned = since(took.start);
  const PlannedLayout& best = plan.chosen();
  const auto G = static_cast<double>(in.global_batch);
  const double run_s = o.steps > 0 ? best.cost.step * static_cast<double>(o.steps) : 0;
  std::printf("layout auto: %zu layouts of global batch %lld over %d rank(s) on %d host(s), fastest first:\n%s",
              plan.layouts.size(), static_cast<long long>(in.global_batch), in.world.size(), in.world.hosts,
              plan.table().c_str());
  std::printf("layout auto: chose %s (%s): predicted %.1f ms a step, %.0f img/s, peak %s a rank (budget %s, %s), "
              "communication %.1f%% of the step\n",
              best.layout.short_text().c_str(), best.layout.flags().c_str(), 1e3 * best.cost.step, G / best.cost.step,
              format_bytes(best.cost.peak).c_str(), format_bytes(in.budget).c_str(), in.budget_source.c_str(),
              100 * best.cost.comm_share());
  std::printf("layout auto: planned in %.2f s (compute probe %.2f s, memory probe %.2f s, links %.2f s): %.2f%% of a "
              "10-minute run%s\n",
              planned, took.compute, took.memory, took.link, 100 * planned / 600,
              run_s > 0 ? detail::str_cat(", ", std::lround(1000 * planned / (run_s + planned)) / 10.0,
                                          "% of this run's predicted ", std::lround(run_s), " s")
                              .c_str()
                        : "");
  std::fflush(stdout);
  json j = plan.to_json();
  j["link"] = in.link.to_json();
  j["compute"] = in.compute.to_json();
  j["world"] = {{"hosts", in.world.hosts}, {"ranks_per_host", in.world.ranks_per_host}};
  j["budget_bytes"] = in.budget;
  j["budget_source"] = in.budget_source;
  j["planning_s"] = planned;
  return j;
}

}  // namespace

json choose_layout(comm::World& world, TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                   DataSource& data, const StepFn& step_fn) {
  Timings took;
  // The world: hosts x ranks per host (the planner's model needs as many on every host).
  const int64_t local_sizes[1] = {world.local_size()};
  if (!comm::same_on_every_rank(world.comm(), local_sizes))
    RT_THROW_PERMANENT("--layout auto: the hosts hold different numbers of ranks; give the layout by hand");
  const PlanInput in = gather_plan_input(world, o, device, dog, model, data, step_fn,
                                         {world.num_nodes(), world.local_size(), device.is_cuda()}, took);
  // Rank 0 plans; every rank applies its choice.
  std::string text, error;
  if (world.is_root()) {
    try {
      text = plan_and_print(in, o, took).dump();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  comm::agree_or_throw(world.comm(), error, "--layout auto", true);
  json plan = json::parse(comm::broadcast(world.comm(), text, 0));
  const json& c = plan["chosen"];
  Layout l;
  l.stages = c["stages"].get<int>();
  l.replicas = c["replicas"].get<int>();
  l.batch = c["batch"].get<int64_t>();
  l.accum = c["accum"].get<int64_t>();
  l.zero = c["zero"].get<int>();
  const std::string r = c["recompute"].get<std::string>();
  l.recompute = r == "blocks" ? RecomputeChoice::Blocks : r == "pipeline" ? RecomputeChoice::Pipeline : RecomputeChoice::Off;
  l.backend = comm::parse_backend(c["backend"].get<std::string>());
  l.bucket_mb = c["bucket_mb"].get<double>();
  if (l.stages > 1)
    l.split = parse_pipeline_split(c["split"].get<std::string>(), static_cast<int>(in.compute.blocks.size()), l.stages);
  l.apply(o);  // fit() marks the blocks to recompute, as for --recompute given
  return plan;
}

json plan_layout_what_if(comm::World& world, const TrainerOptions& o, Device device, Watchdog& dog, Module& model,
                         DataSource& data, const StepFn& step_fn, const LayoutWhatIf& w) {
  Timings took;
  WorldShape target{w.hosts > 0 ? w.hosts : world.num_nodes(),
                    w.ranks_per_host > 0 ? w.ranks_per_host : world.local_size(), device.is_cuda()};
  RT_CHECK(w.save_link.empty() || world.size() > 1, "--save-link ", w.save_link,
           ": the link is measured between ranks; run ringtrain_plan under mpirun with 2 ranks or more (on 2 hosts ",
           "or more for the link between hosts)");
  PlanInput in = gather_plan_input(world, o, device, dog, model, data, step_fn, target, took);
  const LinkModel measured = in.link;
  if (w.link_rate > 0) in.link.bw_inter = w.link_rate;
  if (w.link_latency > 0) in.link.alpha_inter = w.link_latency;
  if (w.intra_rate > 0) in.link.bw_intra = w.intra_rate;
  if (w.intra_latency > 0) in.link.alpha_intra = w.intra_latency;
  if (w.link_rate > 0 || w.link_latency > 0 || w.intra_rate > 0 || w.intra_latency > 0)
    in.link.source = detail::str_cat("given (", in.link.source, " for what was not)");
  if (w.device_memory > 0) {
    in.budget = w.device_memory;
    in.budget_source = "--device-memory";
  }
  std::string text, error;
  if (world.is_root()) {
    try {
      if (!w.save_link.empty()) {
        io::require_regular_if_exists(w.save_link, "--save-link");
        std::ofstream out(w.save_link);
        out << json{{"link", measured.to_json()}}.dump(1) << "\n";
        out.close();
        RT_CHECK(out.good(), "--save-link: cannot write '", w.save_link, "'");
        std::printf("ringtrain_plan: the link measured here is in %s (--link-calibration %s)\n", w.save_link.c_str(),
                    w.save_link.c_str());
      }
      std::printf("ringtrain_plan: %d host(s) x %d rank(s) (%s); compute measured here (%s), link %s: "
                  "%.0f us + %.2f GB/s between hosts, %.1f us + %.2f GB/s inside one\n",
                  target.hosts, target.ranks_per_host, w.hosts > 0 || w.ranks_per_host > 0 ? "given" : "this run's",
                  in.compute.source.c_str(), in.link.source.c_str(), 1e6 * in.link.alpha_inter, in.link.bw_inter / 1e9,
                  1e6 * in.link.alpha_intra, in.link.bw_intra / 1e9);
      text = plan_and_print(in, o, took).dump();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  comm::agree_or_throw(world.comm(), error, "ringtrain_plan", true);
  return json::parse(comm::broadcast(world.comm(), text, 0));
}

}  // namespace ringtrain::runtime
