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
#include <functional>
#include <set>
#include <span>

#include "comm/host_collectives.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/check.h"
#include "core/clock.h"
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
#include "runtime/layout/layout_probe.h"
#include "runtime/loop/reporter.h"
#include "runtime/memory/memory_budget.h"
#include "runtime/memory/memory_plan.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/step/evaluate.h"
#include "runtime/step/loss_log.h"
#include "runtime/step/replica.h"
#include "runtime/telemetry/profiler.h"
#include "runtime/telemetry/run_log.h"
#include "runtime/telemetry/trace.h"

namespace ringtrain::runtime {

using json = nlohmann::json;
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
  if (options_.cuda_graph && device_.is_cpu() && !cuda_graph_emulated())
    RT_THROW_PERMANENT("--cuda-graph captures the step on a GPU, but this rank trains on the CPU (",
                       options_.device == DeviceChoice::Auto ? cuda_status().reason : "--device cpu",
                       "): drop --cuda-graph");
  if (options_.cuda_graph && world_.size() > 1)
    RT_THROW_PERMANENT("--cuda-graph captures one rank's step, and this job has ", world_.size(),
                       " ranks (the gradient all-reduce between them is not captured): run one rank, or drop "
                       "--cuda-graph");
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
      std::vector<std::pair<std::string, std::string>> outputs = {{"--log-jsonl", options_.log_jsonl},
                                                                  {"--trace", options_.trace}};
      outputs.insert(outputs.end(), options_.written_files.begin(), options_.written_files.end());
      for (const auto& [flag, path] : outputs) {
        if (error.empty()) error = dir.output_problem(flag, path);
        if (error.empty()) error = check_output_file(flag, path);
        if (error.empty()) error = io::clobber_problem(flag, path, flag == "--log-jsonl");
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!note.empty()) std::fprintf(stderr, "%s: note: %s\n", options_.program.c_str(), note.c_str());
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
      Watchdog& dog, FolderLock* lock, Module& model, DataSource& data, StepFn step_fn, json memory, json layout_plan)
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
        memory_(std::move(memory)),
        layout_plan_(std::move(layout_plan)) {
    permanent_errors([&] {
      inject_.check_steps(plan_.total_steps);
      inject_.check_cuda_graph(o.cuda_graph);
    });
  }

  TrainResult run();

 private:
  struct EpochEnd {
    Cursor at;
    bool complete = false;  // every micro-batch of the epoch ran
  };
  Cursor start();
  std::vector<CheckpointDir::Entry> claim_folder(const std::optional<Resumed>& resumed);
  void tidy_folder(const std::vector<CheckpointDir::Entry>& others, const std::optional<Resumed>& resumed);
  // The last checkpoint this run wrote: its step (-1: none yet) and when (--checkpoint-every-min counts from
  // it, or from the start).
  struct Saved {
    int64_t step = -1;
    Clock::time_point when;
  };
  EpochEnd train_epoch(int64_t epoch, Cursor at, Saved& saved);
  // How a step ended: whether it ran (no: the epoch's batches ran out first), and whether rank 0 asked for a
  // checkpoint now (--checkpoint-every-min: its clock decides, the check-in tells every rank).
  struct StepEnd {
    bool ran = false;
    bool checkpoint_asked = false;
  };
  StepEnd train_step(int64_t epoch, int64_t step, int64_t& micro, const Saved& saved);
  // One step's micro-batches: this rank's forwards and backwards (through the pipeline's stages with
  // --pipeline-stages). False when the epoch's batches ran out first.
  struct MicroTimes {
    Clock::time_point begin, backward_start, backward_end;
  };
  bool run_micro_batches(int64_t epoch, int64_t step, int64_t& micro, MicroTimes& t);
  // One micro-batch's forward and backward (the k-th of the step) on `batch`, timed into the step.
  void micro_step(const data::Batch& batch, int64_t k, int64_t epoch, int64_t step, int64_t micro, MicroTimes& m,
                  Clock::time_point t0, Clock::time_point t1);
  // --cuda-graph: the step through the graph (captured first where not yet). NotTaken: nothing was read,
  // the step runs op by op; RanOut: the epoch's batches ran out; Micro: the micro-batches ran op by op on
  // the batches read (shapes other than the captured ones; an optimizer that cannot be captured), the rest
  // of the step is the caller's; Whole: the step ran, its optimizer update and zeroed gradients included.
  enum class GraphRun { NotTaken, RanOut, Micro, Whole };
  GraphRun run_graph_step(int64_t epoch, int64_t step, int64_t& micro, MicroTimes& m);
  // The graph is off from now on, for `why`: said on stderr and in the JSONL log.
  void graph_off(int64_t step, const std::string& why);
  bool run_pipelined(int64_t epoch, int64_t step, int64_t& micro, MicroTimes& t);
  std::string non_finite_loss(double loss, int64_t epoch, int64_t step, int64_t micro) const;
  // drop_path's keying of the step's k-th micro-batch (core/ops.h sample_draws): its samples' place in the
  // step's global batch (the sampler deals each micro-batch to the replicas in order) and the generator's
  // stream where its forward begins. Whatever the split over ranks and micro-batches, a sample draws the same.
  SampleDraws micro_draws(int64_t step, int64_t k) const {
    return {.set = true,
            .step = static_cast<uint64_t>(step),
            .first_sample = k * plan_.per_step_global + static_cast<int64_t>(layout_.replica) * plan_.batch,
            .micro_origin = rng_stream()};
  }
  // Reads the pending losses (losses_): each into the report, a non-finite one (unscaled) as the error.
  void read_losses();
  void take_loss(const LossLog::Origin& at, double loss);
  void evaluate_now(int64_t epoch, int64_t step);
  Saved save(const Cursor& at);

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
  const json memory_;       // the memory plan's prediction (the plan record's), null with --pipeline-stages
  const json layout_plan_;  // --layout auto's plan (the plan record's "layout"), null without
  // Where it started, set once by start(): what every checkpoint it writes records.
  std::string run_id_;                 // this run's identity
  bool steps_follow_position_ = true;  // false once a resume changed the global batch (TrainState)
  std::string resumed_from_;
  int64_t first_step_ = 0;
  // The losses since the host last read them: on the GPU, read at reports, checkpoints and epoch ends only.
  LossLog losses_{device_.is_cuda()};
  std::unique_ptr<StepProfiler> profiler_;  // --profile: made when the first step is known
  // --cuda-graph (core/device.h CudaGraph): the step captured once and replayed. The graph reads the
  // micro-batches from `slots` (each step's batches copied in) and leaves their losses in `losses`.
  struct GraphStep {
    CudaGraph graph;
    std::vector<data::Batch> slots;
    std::vector<Tensor> losses;
    std::string off;                           // why the steps run op by op ("" while the graph may be used)
    std::function<void(bool capturing)> work;  // what the graph captured (run_graph_step)
    int64_t step = 0;                          // the step it runs for (an emulated replay runs work again)
  };
  std::unique_ptr<GraphStep> graph_;
  // On CUDA every step ends on a device event, and the host waits for the previous step's before it ends
  // the current one: never more than one step ahead of the GPU, so the steps' host times keep the GPU's
  // pace. Op by op the launch queue held the host back already; a replayed graph is one launch a step and
  // would otherwise never wait, its median step then the host's launch time. Returns the wait.
  struct StepFence {
    Event ends[2];
    int64_t recorded = 0;
  };
  std::unique_ptr<StepFence> fence_;
  double pace_to_device(int64_t step);
};

// The loop: from where the run starts, epochs of optimizer steps, each epoch followed by its evaluation and
// checkpoint where the cadence says; then the final checkpoint, the summary and the collective teardown.
TrainResult Run::run() {
  model_.to(device_);
  model_.train();
  Cursor at = start();
  reporter_->announce(*replica_, threads_, at, resumed_from_, run_id_, data_.warnings());
  const Clock::time_point run_start = Clock::now();
  Saved saved{.step = -1, .when = run_start};
  first_step_ = at.step;
  profiler_ =
      std::make_unique<StepProfiler>(device_, o_.profile_steps, first_step_, kProfileWarmupSteps, o_.profile_layers);
  for (int64_t epoch = at.position.epoch; epoch < plan_.epochs && !finished(at, plan_); ++epoch) {
    const EpochEnd end = train_epoch(epoch, at, saved);
    at = end.at;
    const AfterEpoch next = after_epoch(o_, plan_, epoch, finished(at, plan_), end.complete, saved.step == at.step);
    if (next.evaluate) evaluate_now(epoch, at.step);
    for (const std::string& w : data_.take_decode_warnings())  // each rank of its own records
      std::fprintf(stderr, "%s: warning: rank %d, epoch %lld: %s; --strict refuses them\n", o_.program.c_str(),
                   world_.rank(), static_cast<long long>(epoch + 1), w.c_str());
    if (next.checkpoint) saved = save(at);
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
  const double elapsed_s = seconds(Clock::now() - run_start);
  trace_.write(world_);
  TrainResult result = reporter_->summarize({.at = at,
                                             .first_step = first_step_,
                                             .elapsed_s = elapsed_s,
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
    pipeline_ = std::make_unique<Pipeline>(world_, o_, device_, model_, data_.info(), dog_, inject_);
    data_.set_images(layout_.first());
    scope = pipeline_->scope();
    if (world_.is_root()) std::printf("%s\n", pipeline_->describe().c_str());
  }
  replica_ = std::make_unique<Replica>(world_, o_, device_, model_, step_fn_, from, scope);
  if (o_.cuda_graph && !pipeline_) graph_ = std::make_unique<GraphStep>();
  if (device_.is_cuda())
    fence_ = std::make_unique<StepFence>(StepFence{{Event::create(device_), Event::create(device_)}});
  reporter_ = std::make_unique<Reporter>(world_, o_, device_, plan_, replica_->sync().buckets().size(),
                                         pipeline_ ? pipeline_->plan() : json(), memory_, layout_plan_);
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
Run::EpochEnd Run::train_epoch(int64_t epoch, Cursor at, Saved& saved) {
  sampler_.set_epoch(epoch);
  if (epoch == at.position.epoch && at.position.next_batch > 0) sampler_.restore(at.position);
  int64_t micro = sampler_.state().next_batch;  // the epoch's micro-batches taken
  if (!pipeline_ || pipeline_->reads_data()) data_.start_epoch(sampler_, epoch);
  replica_->zero_grad();
  while (!finished(at, plan_)) {
    const StepEnd step = train_step(epoch, at.step, micro, saved);
    if (!step.ran) break;  // the epoch's batches ran out
    at = {at.step + 1, pipeline_ ? data::SamplerState{epoch, micro} : data_.position()};
    const AfterStep next =
        after_step(o_, plan_, at.step, reporter_->steps_since_report(), reporter_->bar(), step.checkpoint_asked);
    if (next.report || next.checkpoint) read_losses();
    if (next.report)
      reporter_->report(epoch, at.step, schedule_.at(at.step - 1),
                        pipeline_ ? pipeline_->interval_report(reporter_->steps_since_report()) : json());
    if (next.checkpoint) saved = save(at);
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
  // No weight changes before the optimizer: autocast casts each once for all the step's micro-batches
  // and recomputed blocks (core/autocast.h).
  WeightCastScope casts;
  if (pipeline_) return run_pipelined(epoch, step, micro, m);
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
    micro_step(*batch, k, epoch, step, micro - 1, m, t0, Clock::now());
  }
  return true;
}

void Run::micro_step(const data::Batch& batch, int64_t k, int64_t epoch, int64_t step, int64_t micro, MicroTimes& m,
                     Clock::time_point t0, Clock::time_point t1) {
  PhaseTimes& time = reporter_->timer().current();
  dog_.phase("forward", step);
  set_sample_draws(micro_draws(step, k));
  const Tensor loss = replica_->forward(batch);
  losses_.add(loss, {epoch, step, micro}, [this](const LossLog::Origin& at, double v) { take_loss(at, v); });
  const auto t2 = Clock::now();
  inject_.after_forward(world_.rank(), step, k);
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

void Run::graph_off(int64_t step, const std::string& why) {
  graph_->off = why;
  if (world_.is_root())
    std::fprintf(stderr, "%s: --cuda-graph: not captured at step %lld, the steps run op by op: %s\n",
                 o_.program.c_str(), static_cast<long long>(step), why.c_str());
  reporter_->write_record(cuda_graph_record(step, why));
}

Run::GraphRun Run::run_graph_step(int64_t epoch, int64_t step, int64_t& micro, MicroTimes& m) {
  GraphStep& g = *graph_;
  if (!g.off.empty() || step < first_step_ + kGraphWarmupSteps || micro + plan_.accum > plan_.micro_per_epoch)
    return GraphRun::NotTaken;  // the op-by-op path, which also ends the epoch where its batches run out
  PhaseTimes& time = reporter_->timer().current();
  const auto t0 = Clock::now();
  m.begin = t0;
  dog_.phase("data loading", step);
  std::vector<data::Batch> batches;
  {
    profile::Span span("data", device_, "data loading");
    for (int64_t k = 0; k < plan_.accum; ++k) {
      std::optional<data::Batch> b = data_.next();
      if (!b) return GraphRun::RanOut;
      batches.push_back(std::move(*b));
    }
  }
  const int64_t first = micro;
  micro += plan_.accum;
  const auto t1 = Clock::now();
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && a.device() == b.device();
  };
  bool fits = !g.slots.empty();
  for (size_t k = 0; fits && k < batches.size(); ++k)
    fits = same(g.slots[k].images, batches[k].images) && same(g.slots[k].labels, batches[k].labels);
  std::string why;
  if (!g.graph.ready()) {
    why = replica_->replayable();
    if (!why.empty()) graph_off(step, "the optimizer step cannot be captured: " + why);
  }
  if (!why.empty() || (g.graph.ready() && !fits)) {  // op by op (other shapes: an epoch's short last batch)
    WeightCastScope casts;
    for (int64_t k = 0; k < plan_.accum; ++k)
      micro_step(batches[static_cast<size_t>(k)], k, epoch, step, first + k, m, k == 0 ? t0 : Clock::now(),
                 k == 0 ? t1 : Clock::now());
    return GraphRun::Micro;
  }
  dog_.phase("forward and backward (CUDA graph)", step);
  {
    NoGradGuard no_grad;
    if (g.slots.empty()) {  // made outside the capture: they outlive it, and every replay reads them
      for (const data::Batch& b : batches)
        g.slots.push_back(data::Batch{b.images.detach().clone(), b.labels.detach().clone(), b.valid, b.index});
    } else {
      for (size_t k = 0; k < batches.size(); ++k) {
        g.slots[k].images.copy_(batches[k].images);
        g.slots[k].labels.copy_(batches[k].labels);
      }
    }
  }
  replica_->stage(schedule_.at(step));
  g.step = step;
  if (!g.graph.ready()) {
    // The step from its micro-batches to its zeroed gradients, reading the slots: captured, or (the capture
    // failed) run once. It lives with the graph (an emulated graph, core/device.h, runs it at each replay).
    // capturing: a draw of the host's generator (dropout's masks) would be baked into every replay: refused.
    g.work = [this](bool capturing) {
      GraphStep& gs = *graph_;
      const uint64_t draws = rng_stream();
      WeightCastScope casts;
      gs.losses.assign(static_cast<size_t>(plan_.accum), Tensor());
      for (int64_t k = 0; k < plan_.accum; ++k) {
        set_sample_draws(micro_draws(gs.step, k));
        const Tensor loss = replica_->forward(gs.slots[static_cast<size_t>(k)]);
        gs.losses[static_cast<size_t>(k)] = loss.detach();
        replica_->backward(loss, k + 1 == plan_.accum);
      }
      replica_->finish_gradients();
      replica_->apply_and_zero();
      if (capturing && rng_stream() != draws)
        RT_THROW("the step draws random numbers on the host (dropout): every replay would use this step's");
    };
    // The op-by-op steps' cached blocks back to the device first: the graph keeps a pool of its own (its
    // stream's, core/device.h), which would otherwise sit beside them for the rest of the run.
    empty_cache(device_);
    const uint64_t draws = rng_stream();
    const bool captures = device_.is_cuda();  // else emulated: nothing is baked in
    why = g.graph.capture(device_, [this, captures] { graph_->work(captures); });
    if (!why.empty()) {
      // Nothing of the capture ran: this step runs op by op below, as if the capture had not been tried.
      replica_->discard_step();
      set_rng_stream(draws);
      empty_cache(device_);  // the capture's blocks
      graph_off(step, why);
      g.work(false);
    } else {
      reporter_->write_record(cuda_graph_record(step, ""));
      if (world_.is_root())
        std::printf("%s: --cuda-graph: the step was captured at step %lld and is replayed from here%s\n",
                    o_.program.c_str(), static_cast<long long>(step),
                    captures ? "" : " (emulated on the CPU: RINGTRAIN_CUDA_GRAPH_EMULATE)");
    }
  }
  if (g.graph.ready()) g.graph.replay();
  for (int64_t k = 0; k < plan_.accum; ++k)
    losses_.add(g.losses[static_cast<size_t>(k)], {epoch, step, first + k},
                [this](const LossLog::Origin& at, double v) { take_loss(at, v); });
  const auto t2 = Clock::now();
  time.data_wait += seconds(t1 - t0);
  time.backward += seconds(t2 - t1);  // the whole step, its optimizer included, in one launch
  trace_.span("data_wait", t0, t1, step);
  trace_.span("cuda graph replay", t1, t2, step);
  m.backward_start = t1;
  m.backward_end = t2;
  return GraphRun::Whole;
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
  m.backward_start = w.backward_start;
  m.backward_end = w.backward_end;
  return true;
}

// The accum micro-batches of one optimizer step (`step`: steps done before it), the step, and the ranks'
// check-in.
Run::StepEnd Run::train_step(int64_t epoch, int64_t step, int64_t& micro, const Saved& saved) {
  MicroTimes m;
  profiler_->begin_step(step);
  const GraphRun graphed = graph_ ? run_graph_step(epoch, step, micro, m) : GraphRun::NotTaken;
  if (graphed == GraphRun::RanOut || (graphed == GraphRun::NotTaken && !run_micro_batches(epoch, step, micro, m)))
    return {};
  PhaseTimes& time = reporter_->timer().current();
  const Clock::time_point begin = m.begin, backward_start = m.backward_start, backward_end = m.backward_end;
  dog_.phase("gradient all-reduce (waiting for other ranks)", step);
  if (graphed != GraphRun::Whole) {
    profile::Span span("allreduce", device_, "gradient all-reduce");
    replica_->finish_gradients();
  }
  const auto t4 = Clock::now();
  dog_.phase("optimizer", step);
  const StepOutcome outcome = graphed == GraphRun::Whole ? StepOutcome{} : replica_->step(schedule_.at(step), step);
  if (!outcome.took) reporter_->step_skipped();
  if (outcome.took && o_.clip_grad_norm > 0) reporter_->add_grad_norm(outcome.grad_norm);
  const auto t5 = Clock::now();
  // The GPU's lag behind the host: its compute (a replayed graph's whole step), counted as backward.
  const double device_wait = pace_to_device(step);
  time.backward += device_wait;
  const auto tw = Clock::now();
  const int64_t done = step + 1;
  if (inject_.fires(world_.rank(), done)) dog_.phase("injected fault (RINGTRAIN_INJECT)", done);
  const int64_t reported = inject_.after_step(world_.rank(), done);
  dog_.phase("step check-in (waiting for other ranks)", done);
  // --checkpoint-every-min: rank 0's clock decides, and its decision reaches every rank in the check-in.
  const bool want_checkpoint = world_.is_root() && time_checkpoint_due(o_, seconds(Clock::now() - saved.when));
  const bool checkpoint_requested =
      check_in_step(world_, reported, replica_->bucket_plan(), want_checkpoint ? 1 : 0) > 0;
  const auto t6 = Clock::now();
  if (world_.is_root()) comm::supervisor_event(json{{"event", "step"}, {"step", done}}.dump());
  // A replayed step's all-reduce ran inside the graph: no timings of its own (the capture step's would repeat).
  static const std::vector<comm::GradSync::BucketTiming> kNone;
  const auto& buckets = graphed == GraphRun::Whole ? kNone : replica_->sync().last_bucket_timings();
  trace_.span("exposed_comm", backward_end, t4, step);
  for (const auto& b : buckets) trace_.span(detail::str_cat("allreduce bucket ", b.bucket), b.begin, b.end, step, 1);
  trace_.span("optimizer", t4, t5, step);
  if (device_wait > 0) trace_.span("waiting for the GPU", t5, tw, step);
  trace_.span("step check-in", tw, t6, step);
  // The check-in waits for the slowest rank: exposed communication, not optimizer time.
  time.exposed_comm += seconds(t4 - backward_end) + seconds(t6 - tw);
  if (pipeline_) pipeline_->end_step(seconds(t6 - begin));
  time.optimizer = seconds(t5 - t4);
  reporter_->timer().end_step(seconds(t6 - begin), counts_in_breakdown(done, first_step_, plan_.total_steps),
                              backward_start, buckets);
  if (profiler_->end_step(step)) {
    const profile::Table& table = *profiler_->table();
    if (world_.is_root()) std::printf("%s", format_profile(table).c_str());
    reporter_->write_record(profile_record(table));
  }
  return {.ran = true, .checkpoint_asked = checkpoint_requested};
}

double Run::pace_to_device(int64_t step) {
  if (!fence_) return 0;
  const auto t = Clock::now();
  StepFence& f = *fence_;
  f.ends[f.recorded % 2].record(current_stream());
  if (f.recorded > 0) {
    const Event& previous = f.ends[(f.recorded - 1) % 2];
    if (!previous.query()) {
      dog_.phase("waiting for the GPU to finish the step before", step);
      previous.synchronize();
    }
  }
  ++f.recorded;
  return seconds(Clock::now() - t);
}

void Run::evaluate_now(int64_t epoch, int64_t step) {
  data::Loader* loader = data_.test_loader();
  if (!loader) return;
  replica_->average_buffers();  // without SyncBatchNorm the running statistics differ per rank
  EvalOptions eo;
  eo.batch = o_.batch;
  eo.label_smoothing = o_.label_smoothing;
  eo.ignore_index = o_.ignore_index;
  if (data_.info().segmentation) eo.classes = data_.info().classes;
  eo.on_batch = [&] { dog_.phase("evaluation", step); };
  eo.on_wait = [&] { dog_.phase("evaluation all-reduce (waiting for other ranks)", step); };
  const EvalResult e = pipeline_ ? pipeline_->evaluate(loader, data_.info().test_size, eo, step)
                                 : evaluate(model_, *loader, data_.info().test_size, world_, eo);
  // A test loss that is not a number is a failure, never an accuracy (a NaN output is no class's maximum).
  // Every rank holds the same all-reduced figures, so every rank stops here.
  if (!std::isfinite(e.loss))
    throw PermanentError(detail::str_cat(
        "the evaluation after step ", step, " gave a test loss of ",
        std::isnan(e.loss) ? "NaN" : (e.loss > 0 ? "+inf" : "-inf"), " over ", e.count,
        e.segmentation ? " pixels" : " images",
        ": the model's outputs are not finite (weights that diverged, or BatchNorm running statistics that cannot "
        "be, such as a negative running_var), so there is no accuracy to report"));
  reporter_->evaluated(epoch, step, e);
}

Run::Saved Run::save(const Cursor& at) {
  if (!ckpt_.on()) return {-1, Clock::now()};
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
  if (world_.is_root())
    comm::supervisor_event(json{{"event", "checkpoint"}, {"step", at.step}, {"path", written}}.dump());
  return {at.step, Clock::now()};
}

}  // namespace

json Trainer::plan_layout(Module& model, DataSource& data, const LayoutWhatIf& what_if, const StepFn& step_fn) {
  watchdog_->phase("startup: planning the layout", 0);
  struct Pause {
    Watchdog& dog;
    ~Pause() { dog.pause(); }
  } pause{*watchdog_};
  RunLog log(options_.log_jsonl, world_.is_root());  // an unwritable path fails before the probes
  model.to(device_);
  model.train();
  json plan =
      plan_layout_what_if(world_, with_data(options_, data.info()), device_, *watchdog_, model, data, step_fn, what_if);
  if (log.on()) log.write({{"type", "layout_plan"}, {"program", options_.program}, {"layout", plan}});
  return plan;
}

TrainResult Trainer::fit(Module& model, DataSource& data, const StepFn& step_fn) {
  watchdog_->phase("startup: preparing the run", 0);
  // The caller's work after the run (or after catching its error) is not a stuck phase.
  struct Pause {
    Watchdog& dog;
    ~Pause() {
      dog.pause();
      set_sample_draws({});  // the run's keying of drop_path ends with it
    }
  } pause{*watchdog_};
  model.to(device_);
  model.train();
  // The options as this run resolves them: --layout auto chooses the layout, -b auto and --global-batch
  // become a batch and an accumulation.
  TrainerOptions o = with_data(options_, data.info());
  json layout;
  if (o.layout_auto) {
    layout = choose_layout(world_, o, device_, *watchdog_, model, data, step_fn);
    // The planner checked --max-memory with its own measurements, what its probes left included; the memory
    // plan below still predicts and records, against the device's memory (its baseline, taken after the
    // probes, holds what they left: 3-12 MiB on the CPU, docs/LAYOUT.md).
    o.max_memory = 0;
    layout_ = permanent_errors([&] { return PipelineLayout::of(world_.rank(), world_.size(), o.pipeline_stages); });
  }
  if (o.recompute) {
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
  json memory = plan_memory(world_, o, device_, *watchdog_, model, data, step_fn);
  Run run(world_, o, layout_, device_, threads_, *watchdog_, lock_.get(), model, data, step_fn, std::move(memory),
          std::move(layout));
  return run.run();
}

}  // namespace ringtrain::runtime
