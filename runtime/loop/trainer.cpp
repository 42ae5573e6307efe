// runtime/loop/trainer.cpp: the Trainer (options checked, rank bound, generator seeded, preflight, output paths
// proven) and the loop. fit() makes a Run, whose run() reads top to bottom: plan the run, resume, build this
// rank's Replica, then epochs of optimizer steps, each of accum micro-batches, with reports, evaluations and
// checkpoints where the cadences of runtime/config/plan.h say, and a summary. The pieces: runtime/config/plan.h (the
// run's shape and its policies, pure), runtime/checkpoint/resume.h (where the run starts), runtime/step/replica.h
// (forward, backward and the optimizer step across ranks), runtime/loop/reporter.h (lines, records, timing).
#include "runtime/loop/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <span>

#include "comm/host_collectives.h"
#include "core/check.h"
#include "core/ops.h"
#include "io/files.h"
#include "layers/checkpoint.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/folder_lock.h"
#include "runtime/checkpoint/resume.h"
#include "runtime/cluster/check_in.h"
#include "runtime/cluster/fault_injection.h"
#include "runtime/cluster/gpu_choice.h"
#include "runtime/cluster/preflight.h"
#include "runtime/config/plan.h"
#include "runtime/loop/reporter.h"
#include "runtime/memory/memory_budget.h"
#include "runtime/memory/memory_plan.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/step/evaluate.h"
#include "runtime/step/loss_log.h"
#include "runtime/step/replica.h"
#include "runtime/telemetry/profiler.h"
#include "runtime/telemetry/trace.h"

namespace ringtrain::runtime {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

// Where an output file goes must exist and be writable now, not after the first epoch.
std::string check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return "";
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(parent, ec))
    return detail::str_cat(flag, ": folder '", parent.string(), "' of '", path, "' does not exist");
  if (::access(parent.c_str(), W_OK) != 0)
    return detail::str_cat(flag, ": folder '", parent.string(), "' is not writable");
  if (fs::is_directory(path, ec)) return detail::str_cat(flag, ": '", path, "' is a folder, not a file");
  try {
    io::require_regular_if_exists(path, flag);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0)
    return detail::str_cat(flag, ": '", path, "' is not writable");
  return "";
}

}  // namespace

Trainer::Trainer(comm::World& world, TrainerOptions options) : world_(world), options_(std::move(options)) {
  // Bad flags (and a malformed RINGTRAIN_INJECT) are refused before any work, as errors no restart fixes.
  permanent_errors([this] {
    validate_options(options_);
    FaultInjection::from_env().check_world(world_.size());
    layout_ = PipelineLayout::of(world_.rank(), world_.size(), options_.pipeline_stages);
  });
  // First of all collectives: ranks with different flags would otherwise hang in one the others skip.
  check_same_config(world_, rank_agreement(options_));
  watchdog_ = std::make_unique<Watchdog>(world_, options_.timeout);
  watchdog_->phase("startup: binding the rank", 0);
  Device want = Device::cpu();
  if (options_.device == DeviceChoice::Cuda || (options_.device == DeviceChoice::Auto && cuda_available()))
    want = Device::cuda(0);
  const int chosen = want.is_cuda() ? choose_this_ranks_gpu() : -1;
  const comm::DeviceBinding binding = world_.bind(want, options_.threads, options_.allow_shared_gpu, chosen);
  device_ = binding.device;
  threads_ = binding.threads;
  agree_on_device();
  manual_seed(options_.seed);     // the model built next is initialised identically on every rank
  set_allow_tf32(options_.tf32);  // before the memory plan's probe and the pipeline's timings run the model
  if (options_.check) {
    const comm::Backend backend = options_.backend.value_or(comm::auto_backend(world_, device_));
    quick_preflight(world_, backend, device_);
  }
  std::string error, note;
  if (world_.is_root()) {
    try {
      const CheckpointDir dir(options_.checkpoint_dir, options_.keep_last);
      dir.check_writable(std::max<int64_t>(options_.steps, 99999999));
      if (dir.on()) lock_ = FolderLock::acquire(dir.dir(), note);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!note.empty()) std::fprintf(stderr, "%s: note: %s\n", options_.program.c_str(), note.c_str());
    for (const auto& [flag, path] :
         {std::pair{"--log-jsonl", options_.log_jsonl}, std::pair{"--trace", options_.trace}})
      if (error.empty()) error = check_output_file(flag, path);
  }
  comm::agree_or_throw(world_.comm(), error, "checking the output paths", true);
  // What the app does next (open the data, build the model) is guarded too, under its own name.
  watchdog_->phase("startup: opening the data and building the model (before fit)", 0);
}

Trainer::~Trainer() = default;

// This rank's GPU by occupancy (runtime/cluster/gpu_choice.h): a free one, locked for the job's life; -1 when NVML
// is not usable (the binding's local_rank % count then). Collective: the ranks of a host learn each
// other's pids, whose CUDA contexts do not make a GPU busy.
int Trainer::choose_this_ranks_gpu() {
  const std::set<unsigned> own = job_pids_on_this_host(world_);
  GpuChoiceOptions co;
  if (!options_.gpus.empty()) co.only = parse_gpu_list(options_.gpus);
  co.allow_shared = options_.allow_shared_gpu;
  co.wait_seconds = 60 * options_.wait_for_gpu;
  const std::string where = detail::str_cat("rank ", world_.rank(), " on ", world_.host());
  watchdog_->phase("startup: choosing a free GPU (--wait-for-gpu)", 0);
  std::string error;
  GpuChoice c;
  try {
    // The watchdog's phase must not time out a wait the user asked for.
    if (co.wait_seconds > 0) watchdog_->pause();
    c = choose_gpu(co, own, where, [&](const std::string& why) {
      std::fprintf(stderr, "%s: %s", options_.program.c_str(), why.c_str());
    });
  } catch (const std::exception& e) {
    error = e.what();
  }
  comm::agree_or_throw(world_.comm(), error, "choosing the GPUs", true);
  if (!c.note.empty() && (c.cuda_index >= 0 || world_.is_root()))
    std::fprintf(stderr, "%s: %s: %s\n", options_.program.c_str(), where.c_str(), c.note.c_str());
  gpu_lock_ = std::move(c.lock);
  return c.cuda_index;
}

// `--device auto` resolves per rank: a node whose GPU is unusable would silently train on the CPU with
// another backend and hang the others in collectives that never match. Every rank must land on the same kind.
void Trainer::agree_on_device() {
  const int64_t cuda[1] = {device_.is_cuda() ? 1 : 0};
  if (comm::same_on_every_rank(world_.comm(), cuda)) return;
  const std::string mine = device_.is_cuda() ? "" : detail::str_cat("no usable GPU here (", cuda_status().reason, ")");
  comm::agree_or_throw(world_.comm(), mine, "putting every rank on the same kind of device (the others train on CUDA)",
                       true);
}

// ---------------------------------------------------------------------------------------------------
// One run of fit(): the loop.

namespace {

class Run {
 public:
  Run(comm::World& world, const TrainerOptions& o, const PipelineLayout& layout, Device device, int threads,
      Watchdog& dog, FolderLock* lock, Module& model, DataSource& data, StepFn step_fn, json memory)
      : world_(world),
        o_(o),
        device_(device),
        threads_(threads),
        dog_(dog),
        lock_(lock),
        model_(model),
        data_(data),
        step_fn_(std::move(step_fn)),
        layout_(layout),
        plan_(permanent_errors([&] { return plan_run(o, data.info(), layout.replicas); })),
        schedule_(permanent_errors([&] { return schedule_for(o, plan_); })),
        ckpt_(o.checkpoint_dir, o.keep_last),
        inject_(FaultInjection::from_env()),
        sampler_(sampler_options(o, data.info(), layout.replica, layout.replicas)),
        trace_(o.trace, o.trace_steps),
        memory_(std::move(memory)) {}

  TrainResult run();

 private:
  struct EpochEnd {
    Cursor at;
    bool complete = false;  // every micro-batch of the epoch ran
  };
  Cursor start();
  std::vector<CheckpointDir::Entry> claim_folder(const std::optional<Resumed>& resumed);
  void tidy_folder(const std::vector<CheckpointDir::Entry>& others, const std::optional<Resumed>& resumed);
  EpochEnd train_epoch(int64_t epoch, Cursor at);
  std::optional<bool> train_step(int64_t epoch, int64_t step, int64_t& micro);
  // One step's micro-batches: this rank's forwards and backwards (through the pipeline's stages with
  // --pipeline-stages). False when the epoch's batches ran out first.
  struct MicroTimes {
    Clock::time_point begin, backward_start, backward_end;
  };
  bool run_micro_batches(int64_t epoch, int64_t step, int64_t& micro, MicroTimes& t);
  bool run_pipelined(int64_t epoch, int64_t step, int64_t& micro, MicroTimes& t);
  std::string non_finite_loss(double loss, int64_t epoch, int64_t step, int64_t micro) const;
  // Reads the pending losses (losses_): each into the report, a non-finite one (unscaled) as the error.
  void read_losses();
  void take_loss(const LossLog::Origin& at, double loss);
  nlohmann::json pipeline_report();
  void evaluate_now(int64_t epoch, int64_t step);
  void save(const Cursor& at);

  // What the run is, fixed at its start.
  comm::World& world_;
  const TrainerOptions& o_;
  const Device device_;
  const int threads_;
  Watchdog& dog_;
  FolderLock* lock_;  // rank 0's lock of --checkpoint-dir (null elsewhere and without checkpoints)
  Module& model_;
  DataSource& data_;
  const StepFn step_fn_;
  const PipelineLayout layout_;  // one stage of world-size replicas without --pipeline-stages
  const RunPlan plan_;
  const LrSchedule schedule_;
  CheckpointDir ckpt_;  // told the run's identity in start()
  const FaultInjection inject_;
  // What it runs with.
  data::DistributedSampler sampler_;
  std::unique_ptr<Pipeline> pipeline_;  // with --pipeline-stages
  std::unique_ptr<Replica> replica_;
  std::unique_ptr<Reporter> reporter_;
  Trace trace_;
  const json memory_;         // the memory plan's prediction (the plan record's), null with --pipeline-stages
  uint64_t bucket_plan_ = 0;  // checked at every step's check-in
  // What it has done.
  std::string run_id_;                 // this run's identity, in every checkpoint it writes
  bool steps_follow_position_ = true;  // false once a resume changed the global batch (TrainState)
  std::string resumed_from_;
  int64_t first_step_ = 0, saved_step_ = -1, skipped_steps_ = 0;
  double grad_norm_ = 0;  // of the last step taken, before clipping (with --clip-grad-norm)
  // This stage's compute and step time since the last report (with --pipeline-stages).
  double interval_busy_s_ = 0, interval_step_s_ = 0;
  int64_t interval_held_bytes_ = 0;  // the most activation memory a step of the interval held
  std::optional<EvalResult> last_eval_;
  // The losses since the host last read them: on the GPU, read at reports, checkpoints and epoch ends only.
  LossLog losses_{device_.is_cuda()};
  std::unique_ptr<StepProfiler> profiler_;   // --profile: made when the first step is known
  Clock::time_point run_start_, last_save_;  // rank 0's last_save_: --checkpoint-every-min counts from it
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The loop: from where the run starts, epochs of optimizer steps, each epoch followed by its evaluation and
// checkpoint where the cadence says; then the final checkpoint, the summary and the collective teardown.
TrainResult Run::run() {
  model_.to(device_);
  model_.train();
  Cursor at = start();
  reporter_->announce(*replica_, threads_, at, resumed_from_, run_id_, data_.warnings());
  run_start_ = last_save_ = Clock::now();
  first_step_ = at.step;
  profiler_ =
      std::make_unique<StepProfiler>(device_, o_.profile_steps, first_step_, kProfileWarmupSteps, o_.profile_layers);
  for (int64_t epoch = at.position.epoch; epoch < plan_.epochs && !finished(at, plan_); ++epoch) {
    const EpochEnd end = train_epoch(epoch, at);
    at = end.at;
    const AfterEpoch next = after_epoch(o_, plan_, epoch, finished(at, plan_), end.complete, saved_step_ == at.step);
    if (next.evaluate) evaluate_now(epoch, at.step);
    for (const std::string& w : data_.take_decode_warnings())  // each rank of its own records
      std::fprintf(stderr, "%s: warning: rank %d, epoch %lld: %s; --strict refuses them\n", o_.program.c_str(),
                   world_.rank(), static_cast<long long>(epoch + 1), w.c_str());
    if (next.checkpoint) save(at);
  }
  data_.stop();
  if (profiler_->on() && !profiler_->table() && world_.is_root())
    std::fprintf(stderr,
                 "%s: profile: the run ended before --profile's window (%lld warm-up steps, then %lld) was over; "
                 "no table\n",
                 o_.program.c_str(), static_cast<long long>(kProfileWarmupSteps),
                 static_cast<long long>(o_.profile_steps));
  if (at.step > first_step_) save(at);  // a finished run relaunched writes nothing new
  dog_.phase("summary (waiting for other ranks)", at.step);
  const double elapsed_s = seconds(Clock::now() - run_start_);
  trace_.write(world_);
  TrainResult result = reporter_->summarize({.at = at,
                                             .first_step = first_step_,
                                             .skipped_steps = skipped_steps_,
                                             .elapsed_s = elapsed_s,
                                             .eval = last_eval_,
                                             .replica = replica_.get(),
                                             .resumed_from = resumed_from_});
  // The collective teardown, on the success path only: destructors never communicate.
  dog_.phase("closing the communicators (waiting for other ranks)", at.step);
  replica_->close();
  if (pipeline_) pipeline_->close();
  return result;
}

// Where the run starts: afresh, or from the checkpoint of --resume (its weights into the model, the
// generator's stream, the optimizer's state and loss scale into the replica). Builds the replica (rank 0's
// weights everywhere) and the reporter, and makes the checkpoint folder this run's.
Cursor Run::start() {
  std::optional<Resumed> resumed = resume_point(world_, o_, ckpt_, plan_, data_.info().signature);
  const std::vector<CheckpointDir::Entry> others = claim_folder(resumed);
  ReplicaStart from;
  if (resumed) {
    std::vector<std::string> params;
    for (const auto& [name, p] : model_.named_parameters()) params.push_back(name);
    check_content(*resumed, params, o_);
    steps_follow_position_ = !resumed->batch_changed && resumed->loaded.state.steps_follow_position;
    Checkpoint& c = resumed->loaded.checkpoint;
    try {
      model_.load_state_dict(c.model);
    } catch (const std::exception& e) {
      RT_THROW_PERMANENT("--resume ", resumed->path, ": ", e.what());
    }
    c.model = {};  // the weights are in the model now
    if (resumed->loaded.state.rng_stream > 0) set_rng_stream(resumed->loaded.state.rng_stream);
    from = {.optimizer_state = &c.optimizer, .loss_scale = resumed->loaded.state.loss_scale, .from = resumed->path};
  }
  ReplicaScope scope;
  if (o_.pipeline_stages > 1) {
    if (step_fn_)
      RT_THROW_PERMANENT("--pipeline-stages ", o_.pipeline_stages, ": a custom step function (fit(model, data, ",
                         "step_fn)) sees the whole model, which no stage holds; pipelines train with the default loss");
    // The model holds its starting weights everywhere: each stage keeps its blocks' and releases the rest.
    pipeline_ = std::make_unique<Pipeline>(world_, o_, device_, model_, data_.info(), dog_);
    data_.set_images(layout_.first());
    scope = pipeline_->scope();
    if (world_.is_root()) std::printf("%s\n", pipeline_->describe().c_str());
  }
  replica_ = std::make_unique<Replica>(world_, o_, device_, model_, step_fn_, from, scope);
  reporter_ = std::make_unique<Reporter>(world_, o_, device_, plan_, replica_->sync().buckets().size(),
                                         pipeline_ ? pipeline_->plan() : json(), memory_);
  // Each stage has its own buckets: the check-in compares one hash of every stage's.
  bucket_plan_ = bucket_plan_hash(replica_->sync().buckets());
  if (pipeline_) {
    const std::vector<int64_t> all =
        comm::all_gather(world_.comm(), std::span<const int64_t>(reinterpret_cast<const int64_t*>(&bucket_plan_), 1));
    uint64_t h = 1469598103934665603ull;
    for (int s = 0; s < layout_.stages; ++s)
      h = (h ^ static_cast<uint64_t>(all[static_cast<size_t>(layout_.rank_of(s, 0))])) * 1099511628211ull;
    // A rank whose plan differs from its stage's first replica's differs from rank 0's hash too.
    bucket_plan_ =
        h ^ bucket_plan_ ^ static_cast<uint64_t>(all[static_cast<size_t>(layout_.rank_of(layout_.stage, 0))]);
  }
  tidy_folder(others, resumed);
  if (!resumed) return Cursor{};
  resumed_from_ = resumed->path;
  const Cursor at = resumed->at;
  if (world_.is_root())
    std::printf("resumed from %s: step %lld, epoch %lld, batch %lld\n", resumed_from_.c_str(),
                static_cast<long long>(at.step), static_cast<long long>(at.position.epoch),
                static_cast<long long>(at.position.next_batch));
  return at;
}

// The run's identity (a resumed one keeps its checkpoint's; a checkpoint from before identities existed
// makes the folder's files without one this run's too) and the folder's files that belong to another run:
// a new run refuses them unless --start-over, since its own checkpoints would replace theirs.
std::vector<CheckpointDir::Entry> Run::claim_folder(const std::optional<Resumed>& resumed) {
  const bool unmarked = resumed && resumed->loaded.state.run_id.empty();
  run_id_ = resumed && !unmarked ? resumed->loaded.state.run_id : "";
  if (run_id_.empty()) run_id_ = comm::broadcast(world_.comm(), world_.is_root() ? new_run_id() : std::string(), 0);
  ckpt_.set_run(run_id_, unmarked);
  if (lock_) lock_->set_run(run_id_);
  std::vector<CheckpointDir::Entry> others;
  std::string error;
  if (world_.is_root() && ckpt_.on()) {
    try {
      others = others_of(ckpt_, ckpt_.scan());
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (error.empty() && !others.empty() && !o_.start_over)
      error = detail::str_cat(
          "--checkpoint-dir '", ckpt_.dir().string(), "' holds checkpoints of another run: ", describe_entries(others),
          ". This ", resumed ? "run (resumed from " + resumed->path + ")" : std::string("new run"),
          " would mix its checkpoints with them (--resume auto could pick theirs, --keep-last delete them): ",
          resumed ? "" : "continue that run with --resume auto, ",
          "pass --start-over to move them into a set-aside folder of it first, or use another --checkpoint-dir");
  }
  comm::agree_or_throw(world_.comm(), error, "--checkpoint-dir", true);
  return others;
}

// Rank 0, once the run stands: another run's files moved aside (--start-over), and a run resumed from an
// older checkpoint of its own sets aside the later ones of the run it replaces (--resume auto must not
// continue them after a crash of this one).
void Run::tidy_folder(const std::vector<CheckpointDir::Entry>& others, const std::optional<Resumed>& resumed) {
  if (!world_.is_root() || !ckpt_.on()) return;
  if (!others.empty())
    std::fprintf(stderr, "%s: --start-over: moved %s into %s\n", o_.program.c_str(), describe_entries(others).c_str(),
                 ckpt_.move_aside(others).string().c_str());
  if (resumed && o_.resume != "auto")
    for (const auto& name : ckpt_.supersede_after(resumed->at.step))
      std::fprintf(stderr,
                   "%s: warning: set aside %s: it is newer than the resumed step %lld and belongs to the run "
                   "this one replaces\n",
                   o_.program.c_str(), name.c_str(), static_cast<long long>(resumed->at.step));
}

// One epoch's optimizer steps from `at`, until the run's last step or the epoch's last complete step, each
// followed by its report and checkpoint where the cadence says.
Run::EpochEnd Run::train_epoch(int64_t epoch, Cursor at) {
  sampler_.set_epoch(epoch);
  if (epoch == at.position.epoch && at.position.next_batch > 0) sampler_.restore(at.position);
  int64_t micro = sampler_.state().next_batch;  // the epoch's micro-batches taken
  if (!pipeline_ || pipeline_->reads_data()) data_.start_epoch(sampler_, epoch);
  replica_->zero_grad();
  while (!finished(at, plan_)) {
    const std::optional<bool> checkpoint_requested = train_step(epoch, at.step, micro);
    if (!checkpoint_requested) break;  // the epoch's batches ran out
    at = {at.step + 1, pipeline_ ? data::SamplerState{epoch, micro} : data_.position()};
    const AfterStep next =
        after_step(o_, plan_, at.step, reporter_->steps_since_report(), reporter_->bar(), *checkpoint_requested);
    if (next.report || next.checkpoint) read_losses();
    if (next.report)
      reporter_->report(epoch, at.step, schedule_.at(at.step - 1),
                        o_.clip_grad_norm > 0 ? std::optional<double>(grad_norm_) : std::nullopt, pipeline_report());
    if (next.checkpoint) save(at);
  }
  read_losses();
  reporter_->end_epoch();
  EpochEnd end{at, !finished(at, plan_) || micro >= plan_.micro_per_epoch};
  if (end.complete) end.at.position = data::SamplerState{epoch, plan_.micro_per_epoch};
  return end;
}

void Run::take_loss(const LossLog::Origin& at, double loss) {
  // With f16 loss scaling a non-finite loss makes non-finite gradients: the scaler skips that step.
  if (!std::isfinite(loss) && !replica_->scaled())
    throw PermanentError(non_finite_loss(loss, at.epoch, at.step, at.micro));
  reporter_->add_loss(loss);
}

void Run::read_losses() {
  losses_.flush([this](const LossLog::Origin& at, double v) { take_loss(at, v); });
}

std::string Run::non_finite_loss(double loss, int64_t epoch, int64_t step, int64_t micro) const {
  return detail::str_cat("non-finite loss (", loss, ") at step ", step, " (epoch ", epoch, ", micro-batch ", micro,
                         "): lower --lr, add --warmup-epochs, or check the data");
}

bool Run::run_micro_batches(int64_t epoch, int64_t step, int64_t& micro, MicroTimes& m) {
  if (pipeline_) return run_pipelined(epoch, step, micro, m);
  PhaseTimes& time = reporter_->timer().current();
  for (int64_t k = 0; k < plan_.accum; ++k) {
    const auto t0 = Clock::now();
    if (k == 0) m.begin = t0;
    dog_.phase("data loading", step);
    if (micro >= plan_.micro_per_epoch) return false;
    std::optional<data::Batch> batch;
    {
      profile::Span span("data", device_, "data loading");
      batch = data_.next();
    }
    if (!batch) return false;
    ++micro;
    const auto t1 = Clock::now();
    dog_.phase("forward", step);
    const Tensor loss = replica_->forward(*batch);
    losses_.add(loss, {epoch, step, micro - 1}, [this](const LossLog::Origin& at, double v) { take_loss(at, v); });
    const auto t2 = Clock::now();
    dog_.phase("backward", step);
    replica_->backward(loss, k + 1 == plan_.accum);
    const auto t3 = Clock::now();
    time.data_wait += seconds(t1 - t0);
    time.forward += seconds(t2 - t1);
    time.backward += seconds(t3 - t2);
    trace_.span("data_wait", t0, t1, step);
    trace_.span("forward", t1, t2, step);
    trace_.span("backward", t2, t3, step);
    m.backward_start = t2;
    m.backward_end = t3;
  }
  return true;
}

// The step's micro-batches through the stages, in the schedule's order (runtime/pipeline/pipeline.h). Every stage
// knows from the plan whether the epoch has a whole step left, so all of them stop together.
bool Run::run_pipelined(int64_t epoch, int64_t step, int64_t& micro, MicroTimes& m) {
  m.begin = Clock::now();
  if (micro + plan_.accum > plan_.micro_per_epoch) return false;
  const int64_t first = micro;
  auto next_batch = [&]() -> data::Batch {
    std::optional<data::Batch> b = data_.next();
    RT_CHECK(b.has_value(), "pipeline stage ", layout_.stage, ": the data ended at micro-batch ", micro,
             " of the epoch's ", plan_.micro_per_epoch);
    ++micro;
    return std::move(*b);
  };
  auto on_loss = [&](int k, double loss) {
    if (!std::isfinite(loss) && !replica_->scaled())
      throw PermanentError(non_finite_loss(loss, epoch, step, first + k));
    reporter_->add_loss(loss);
  };
  const Pipeline::StepWork w = pipeline_->run_step(*replica_, step, next_batch, on_loss, trace_);
  micro = first + plan_.accum;  // the middle stages read nothing
  PhaseTimes& time = reporter_->timer().current();
  time.data_wait += w.data_wait_s;
  time.forward += w.forward_s;
  time.backward += w.backward_s;
  time.exposed_comm += w.wait_s;  // waiting for the neighbours: the bubble (the check-in adds its own below)
  interval_busy_s_ += w.busy_s;
  interval_held_bytes_ = std::max(interval_held_bytes_, w.held_bytes);
  m.backward_start = w.backward_start;
  m.backward_end = w.backward_end;
  return true;
}

// Per stage (the first replica's): compute per step over the interval, and the share of the step it left idle.
nlohmann::json Run::pipeline_report() {
  if (!pipeline_) return json();
  const auto n = static_cast<double>(std::max<int64_t>(1, reporter_->steps_since_report()));
  const std::vector<double> busy = pipeline_->per_stage(interval_busy_s_ / n);
  const std::vector<double> steps = pipeline_->per_stage(interval_step_s_ / n);
  const std::vector<double> held = pipeline_->per_stage(static_cast<double>(interval_held_bytes_));
  interval_busy_s_ = interval_step_s_ = 0;
  interval_held_bytes_ = 0;
  json bubble = json::array();
  for (size_t s = 0; s < busy.size(); ++s) bubble.push_back(steps[s] > 0 ? 1.0 - busy[s] / steps[s] : 0.0);
  return json{{"busy_s", busy},
              {"bubble", bubble},
              {"activation_bytes", held},
              {"ideal_bubble", ideal_bubble(layout_.stages, static_cast<int>(plan_.accum))}};
}

// The accum micro-batches of one optimizer step (`step`: steps done before it), the step, and the ranks'
// check-in. nullopt when the epoch's batches ran out first; else whether rank 0 asked for a checkpoint now.
std::optional<bool> Run::train_step(int64_t epoch, int64_t step, int64_t& micro) {
  MicroTimes m;
  profiler_->begin_step(step);
  if (!run_micro_batches(epoch, step, micro, m)) return std::nullopt;
  PhaseTimes& time = reporter_->timer().current();
  const Clock::time_point begin = m.begin, backward_start = m.backward_start, backward_end = m.backward_end;
  dog_.phase("gradient all-reduce (waiting for other ranks)", step);
  {
    profile::Span span("allreduce", device_, "gradient all-reduce");
    replica_->finish_gradients();
  }
  const auto t4 = Clock::now();
  dog_.phase("optimizer", step);
  const StepOutcome outcome = replica_->step(schedule_.at(step), step);
  if (!outcome.took) ++skipped_steps_;
  if (outcome.took && o_.clip_grad_norm > 0) grad_norm_ = outcome.grad_norm;
  const auto t5 = Clock::now();
  const int64_t done = step + 1;
  if (inject_.fires(world_.rank(), done)) dog_.phase("injected fault (RINGTRAIN_INJECT)", done);
  const int64_t reported = inject_.after_step(world_.rank(), done);
  dog_.phase("step check-in (waiting for other ranks)", done);
  // --checkpoint-every-min: rank 0's clock decides, and its decision reaches every rank in the check-in.
  const bool want_checkpoint = world_.is_root() && time_checkpoint_due(o_, seconds(Clock::now() - last_save_));
  const bool checkpoint_requested = check_in_step(world_, reported, bucket_plan_, want_checkpoint ? 1 : 0) > 0;
  const auto t6 = Clock::now();
  if (world_.is_root()) comm::supervisor_event(json{{"event", "step"}, {"step", done}}.dump());
  const auto& buckets = replica_->sync().last_bucket_timings();
  trace_.span("exposed_comm", backward_end, t4, step);
  for (const auto& b : buckets) trace_.span(detail::str_cat("allreduce bucket ", b.bucket), b.begin, b.end, step, 1);
  trace_.span("optimizer", t4, t5, step);
  trace_.span("step check-in", t5, t6, step);
  // The check-in waits for the slowest rank: exposed communication, not optimizer time.
  time.exposed_comm += seconds(t4 - backward_end) + seconds(t6 - t5);
  interval_step_s_ += seconds(t6 - begin);
  time.optimizer = seconds(t5 - t4);
  reporter_->timer().end_step(seconds(t6 - begin), counts_in_breakdown(done, first_step_, plan_.total_steps),
                              backward_start, buckets);
  if (profiler_->end_step(step)) {
    const profile::Table& table = *profiler_->table();
    if (world_.is_root()) std::printf("%s", format_profile(table).c_str());
    reporter_->write_record(profile_record(table));
  }
  return checkpoint_requested;
}

void Run::evaluate_now(int64_t epoch, int64_t step) {
  data::Loader* loader = data_.test_loader();
  if (!loader) return;
  replica_->average_buffers();  // without SyncBatchNorm the running statistics differ per rank
  if (pipeline_) {
    last_eval_ = pipeline_->evaluate(loader, data_.info().test_size, o_.batch, o_.label_smoothing, step);
    reporter_->evaluated(epoch, step, *last_eval_);
    return;
  }
  EvalOptions eo;
  eo.batch = o_.batch;
  eo.label_smoothing = o_.label_smoothing;
  eo.on_batch = [&] { dog_.phase("evaluation", step); };
  eo.on_wait = [&] { dog_.phase("evaluation all-reduce (waiting for other ranks)", step); };
  last_eval_ = evaluate(model_, *loader, data_.info().test_size, world_, eo);
  reporter_->evaluated(epoch, step, *last_eval_);
}

void Run::save(const Cursor& at) {
  if (!ckpt_.on()) return;
  dog_.phase("checkpoint", at.step);
  replica_->wait_parameters();  // ZeRO-1: the last step's all-gather, left to the next forward
  // Rank 0's file must describe every rank: BatchNorm running statistics (per rank without SyncBN) are
  // averaged first, so a resumed run (which starts every rank from the file) continues exactly.
  replica_->average_buffers();
  std::string error, written;
  // ZeRO: gathering the sharded state to rank 0 is collective.
  std::vector<std::pair<std::string, Tensor>> optimizer_state, model_state;
  if (pipeline_) {  // every stage's part, gathered on rank 0 (collective)
    model_state = pipeline_->gather_model();
    optimizer_state = pipeline_->gather_optimizer(replica_->optimizer_state());
  } else {
    if (world_.is_root() || o_.zero == 1) optimizer_state = replica_->optimizer_state();
    if (world_.is_root()) model_state = model_.state_dict();
  }
  if (world_.is_root()) {
    TrainState s;
    s.step = at.step;
    s.position = at.position;
    s.world_size = world_.size();
    s.global_batch = plan_.global_batch;
    s.per_step_global = plan_.per_step_global;
    s.lr = schedule_.at(std::max<int64_t>(0, at.step - 1));
    s.rng_stream = rng_stream();
    if (const auto& scaler = replica_->scaler())
      s.loss_scale = LossScaleState{scaler->scale(), scaler->growth_tracker()};
    s.config = o_.to_json();
    s.config["dataset"] = data_.info().signature;
    s.run_id = run_id_;
    s.steps_follow_position = steps_follow_position_;
    SaveOptions seam{.before_rename = [&] { inject_.in_checkpoint_write(world_.rank(), at.step); }};
    try {
      written = ckpt_.save(at.step, Checkpoint{std::move(model_state), std::move(optimizer_state), s.to_json()}, seam)
                    .string();
    } catch (const std::exception& e) {
      error = e.what();
    }
  } else {
    dog_.phase("checkpoint (waiting for other ranks: rank 0 writes it)", at.step);
  }
  comm::agree_or_throw(world_.comm(), error, "writing the checkpoint");
  last_save_ = Clock::now();
  saved_step_ = at.step;
  if (world_.is_root())
    comm::supervisor_event(json{{"event", "checkpoint"}, {"step", at.step}, {"path", written}}.dump());
}

// The memory plan (runtime/memory/memory_plan.h), collective: every rank probes what a micro-batch costs it; rank 0
// resolves -b auto and --global-batch for every rank's budget, and refuses a run some rank's budget does not
// hold (naming the remedies that fit) before anything else is built. Returns the plan record's part.
json plan_memory(comm::World& world, TrainerOptions& o, Device device, Watchdog& dog, Module& model, DataSource& data,
                 const StepFn& step_fn) {
  // --global-batch with a given -b: the accumulation that makes it (with -b auto the plan chooses both).
  if (o.global_batch > 0 && o.batch > 0) {
    const int64_t per = o.batch * (world.size() / o.pipeline_stages);
    if (o.global_batch % per != 0)
      RT_THROW_PERMANENT("--global-batch ", o.global_batch, " is not a multiple of -b ", o.batch, " x ",
                         world.size() / o.pipeline_stages, o.pipeline_stages > 1 ? " replicas" : " ranks");
    o.accum = o.global_batch / per;
  }
  // A stage's memory is its blocks' (the pipeline's own plan measures them).
  if (o.pipeline_stages > 1) return json();
  dog.phase("startup: the memory plan (a forward and backward of a few images)", 0);
  const auto plan_start = Clock::now();
  const DataInfo& info = data.info();
  MemoryFacts f;
  int64_t budget = 0;
  std::string error, budget_source;
  try {
    f.cuda = device.is_cuda();
    f.peak_so_far = f.cuda ? 0 : static_cast<int64_t>(peak_rss_bytes());
    for (const auto& [name, p] : model.named_parameters())
      if (p.requires_grad()) f.param_bytes += p.nbytes();
    f.image_bytes = info.height * info.width * info.channels * 4 + 8;
    f.batches_in_flight = data.batches_in_flight();
    const AllocatorStats before = memory_stats(device);
    f.curve = probe_activations(o, device, model, info, step_fn);
    if (f.cuda) {
      f.baseline = before.allocated_bytes;  // the weights; the probe gave its cached blocks back (memory_plan.h)
    } else {
      // The heap keeps what tensors freed (core/allocator.h, cpu_malloc_reuse), so the resident set is what
      // is not a tensor (libraries, their first-use buffers, the data) plus the tensors' high-water mark.
      // The baseline is the first and the tensors held now (the weights): the run's tensors come on top.
      // Without that reuse (RINGTRAIN_MALLOC_DEFAULTS=1) freed blocks go back: only the held ones are resident.
      const int64_t high = cpu_malloc_reuse() ? std::max(before.peak_allocated_bytes, f.curve.high_water)
                                              : memory_stats(device).allocated_bytes;
      f.baseline = std::max<int64_t>(0, resident_bytes() - high) + memory_stats(device).allocated_bytes;
    }
    if (o.max_memory > 0) {
      budget = o.max_memory;
      budget_source = "--max-memory";
    } else {
      const FreeMemory free = f.cuda ? device_free_memory(device) : host_free_memory();
      const int sharing = f.cuda ? 1 : world.local_size();
      const int64_t held = f.cuda ? memory_stats(device).reserved_bytes : resident_bytes();
      budget = rank_budget(free.bytes, held, sharing);
      budget_source = detail::str_cat(free.str(), sharing > 1 ? detail::str_cat(" / ", sharing, " local ranks") : "");
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  // A model the probe cannot train (say, one that needs real labels) skips the plan, unless the run needs it.
  const bool failed = comm::all_reduce(world.comm(), int64_t{error.empty() ? 0 : 1}, comm::HostOp::Max) > 0;
  if (failed && o.batch > 0 && o.max_memory == 0) {
    if (world.is_root())
      std::fprintf(stderr, "%s: warning: no memory plan (no predicted peak, no budget check): %s\n", o.program.c_str(),
                   error.empty() ? "its probe failed on another rank" : error.c_str());
    return json();
  }
  comm::agree_or_throw(world.comm(), error, "the memory plan (which -b auto and --max-memory need)", true);
  const int64_t mine[5] = {f.baseline, f.peak_so_far, f.curve.fixed, f.curve.per_image, budget};
  const std::vector<int64_t> all = comm::all_gather(world.comm(), std::span<const int64_t>(mine, 5));
  const auto n = static_cast<size_t>(world.size());
  auto facts_of = [&](size_t r) {
    MemoryFacts g = f;
    g.baseline = all[5 * r];
    g.peak_so_far = all[5 * r + 1];
    g.curve = {all[5 * r + 2], all[5 * r + 3]};
    return g;
  };
  // Rank 0 decides: the batch and accumulation, or the refusal.
  int64_t decided[2] = {o.batch, o.accum};
  error.clear();
  if (world.is_root()) {
    try {
      if (o.batch == 0) {
        const int64_t max_batch = std::max<int64_t>(1, info.train_size / world.size() / o.accum);
        AutoBatch best{0, 1};
        for (size_t r = 0; r < n; ++r) {
          const AutoBatch b = choose_batch(o, facts_of(r), world.size(), all[5 * r + 4], max_batch);
          if (best.batch == 0 || b.batch < best.batch) best = b;
        }
        decided[0] = best.batch;
        decided[1] = best.accum;
      }
      TrainerOptions v = o;
      v.batch = decided[0];
      v.accum = decided[1];
      size_t worst = 0;
      int64_t over = INT64_MIN;
      bool fit = true;
      for (size_t r = 0; r < n; ++r) {
        const int64_t predicted = predict_peak(v, facts_of(r), world.size()).total;
        fit = fit && fits(predicted, all[5 * r + 4]);
        if (predicted - all[5 * r + 4] > over) over = predicted - all[5 * r + 4], worst = r;
      }
      if (!fit) {
        const MemoryFacts g = facts_of(worst);
        const int64_t budget_w = all[5 * worst + 4];
        auto probe = [&](const TrainerOptions& w) {
          if (w.recompute != v.recompute) recompute_blocks(model, w.recompute);
          const ActivationCurve c = probe_activations(w, device, model, info, step_fn);
          if (w.recompute != v.recompute) recompute_blocks(model, v.recompute);
          return c;
        };
        const std::vector<Remedy> fixes = remedies(v, g, world.size(), budget_w, probe);
        std::string list;
        for (const Remedy& r : fixes) list += detail::str_cat("\n  ", r.flags, ": ", format_bytes(r.prediction.total));
        error = detail::str_cat(
            "the run does not fit: rank ", worst, " is predicted to reach ", predict_peak(v, g, world.size()).str(),
            " at batch ", v.batch, ", over its budget of ", format_bytes(budget_w), " less 5% to spare (",
            worst == 0 ? budget_source : std::string("its share of its device's free memory"), "). ",
            fixes.empty() ? "Nothing ringtrain can change fits it; free memory or raise --max-memory"
                          : "These changes fit, with their predicted peaks:" + list,
            fixes.empty() ? "" : "\n(or raise --max-memory)",
            detail::str_cat("\n(planned in ", std::lround(1000 * seconds(Clock::now() - plan_start)),
                            " ms, before any step)"));
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  comm::agree_or_throw(world.comm(), error, "the memory plan", true);
  decided[0] = comm::broadcast(world.comm(), decided[0], 0);
  decided[1] = comm::broadcast(world.comm(), decided[1], 0);
  const bool chosen = o.batch == 0;
  o.batch = decided[0];
  o.accum = decided[1];
  json by_rank = json::array(), budgets = json::array();
  MemoryPrediction top;
  for (size_t r = 0; r < n; ++r) {
    const MemoryPrediction p = predict_peak(o, facts_of(r), world.size());
    by_rank.push_back(p.total);
    budgets.push_back(all[5 * r + 4]);
    if (r == 0) top = p;
  }
  if (world.is_root()) {
    if (chosen)
      std::printf("-b auto: batch %lld x accum %lld per rank, the largest micro-batch the memory budget holds%s\n",
                  static_cast<long long>(o.batch), static_cast<long long>(o.accum),
                  o.global_batch > 0 ? detail::str_cat(" for --global-batch ", o.global_batch).c_str() : "");
    std::printf("memory: rank 0 predicted to peak at %s; budget %s (%s)\n", top.str().c_str(),
                format_bytes(all[4]).c_str(), budget_source.c_str());
    std::fflush(stdout);
  }
  json breakdown = top.to_json();
  return {{"predicted_peak_mem_bytes_by_rank", by_rank},
          {"budget_bytes_by_rank", budgets},
          {"budget", budget_source},
          {"breakdown", breakdown},
          {"activations_fixed", f.curve.fixed},
          {"activations_per_image", f.curve.per_image},
          {"batch_auto", chosen}};
}

}  // namespace

TrainResult Trainer::fit(Module& model, DataSource& data, const StepFn& step_fn) {
  watchdog_->phase("startup: preparing the run", 0);
  // The caller's work after the run (or after catching its error) is not a stuck phase.
  struct Pause {
    Watchdog& dog;
    ~Pause() { dog.pause(); }
  } pause{*watchdog_};
  model.to(device_);
  model.train();
  if (options_.recompute) {
    const size_t blocks = permanent_errors([&] { return model.blocks().size(); });
    const int marked = permanent_errors([&] {
      const int n = recompute_blocks(model);
      RT_CHECK(n > 0, "--recompute: none of the model's ", blocks, " blocks (", model.type_name(),
               ") can be recomputed: the last stays plain (its backward follows its forward at once), and a block of ",
               "several modules needs its own set_recompute; split the model into more blocks, or drop --recompute");
      return n;
    });
    if (world_.is_root())
      std::printf(
          "recompute: %d of the model's %zu blocks keep only their input, their forwards run again in "
          "backward; the last runs plain\n",
          marked, blocks);
  }
  // The options as this run resolves them: -b auto and --global-batch become a batch and an accumulation.
  TrainerOptions o = options_;
  json memory = plan_memory(world_, o, device_, *watchdog_, model, data, step_fn);
  Run run(world_, o, layout_, device_, threads_, *watchdog_, lock_.get(), model, data, step_fn, std::move(memory));
  return run.run();
}

}  // namespace ringtrain::runtime
