// runtime/loop/trainer.cpp: the Trainer (options checked, rank bound, generator seeded, preflight, output paths
// proven) and the loop. fit() makes a Run, whose run() reads top to bottom: plan the run, resume, build this
// rank's Replica, then epochs of optimizer steps with reports, evaluations and checkpoints where the cadences of
// runtime/config/plan.h say, and a summary. The pieces: runtime/config/plan.h (the run's shape and its policies,
// pure), runtime/checkpoint/resume.h (where the run starts), runtime/step/step_runner.h (one step, however the run's
// mode runs it), runtime/step/replica.h (forward, backward and the optimizer step across ranks),
// runtime/loop/reporter.h (lines, records, timing).
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
#include "layers/recompute.h"
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
#include "runtime/memory/plan_memory.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/pipeline/pipelined_step.h"
#include "runtime/step/evaluate.h"
#include "runtime/step/graph_step.h"
#include "runtime/step/loss_log.h"
#include "runtime/step/op_by_op_step.h"
#include "runtime/step/replica.h"
#include "runtime/step/step_runner.h"
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
    grid_ = StageGrid::of(world_.rank(), world_.size(), options_.pipeline_stages);
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
    try {  // the first problem found, or what throws
      const CheckpointDir dir(options_.checkpoint_dir, options_.keep_last);
      dir.check_writable(std::max<int64_t>(options_.steps, 99999999));
      if (dir.on()) lock_ = FolderLock::acquire(dir.dir(), note);
      for (const auto& [flag, path] : output_files(options_)) {
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
  error = comm::failure_of([&] {
    // The watchdog's phase must not time out a wait the user asked for.
    if (co.wait_seconds > 0) watchdog_->pause();
    c = choose_gpu(co, own, where, [&](const std::string& why) {
      std::fprintf(stderr, "%s: %s", options_.program.c_str(), why.c_str());
    });
  });
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

// What the Trainer hands a run, fixed for its life.
struct RunSetup {
  comm::World& world;
  const TrainerOptions& options;  // as this run resolves them (fit(): --layout auto, -b auto)
  StageGrid grid;                 // one stage of world-size replicas without --pipeline-stages
  Device device;
  int threads = 1;
  Watchdog& watchdog;
  FolderLock* lock = nullptr;  // rank 0's lock of --checkpoint-dir (null elsewhere and without checkpoints)
  Module& model;
  DataSource& data;
  StepFn step_fn;
  json memory;       // the memory plan's prediction (the plan record's), null with --pipeline-stages
  json layout_plan;  // --layout auto's plan (the plan record's "layout"), null without
  FaultInjection inject = FaultInjection::from_env();
};

// The loop and its cadences; each step runs itself (runtime/step/step_runner.h).
class Run {
 public:
  explicit Run(RunSetup setup)
      : setup_(std::move(setup)),
        plan_(permanent_errors([&] { return plan_run(setup_.options, setup_.data.info(), setup_.grid.replicas); })),
        lr_schedule_(permanent_errors([&] { return schedule_for(setup_.options, plan_); })),
        checkpoints_(setup_.options.checkpoint_dir, setup_.options.keep_last),
        sampler_(sampler_options(setup_.options, setup_.data.info(), setup_.grid.replica, setup_.grid.replicas)),
        trace_(setup_.options.trace, setup_.options.trace_steps) {
    permanent_errors([&] {
      setup_.inject.check_steps(plan_.total_steps);
      setup_.inject.check_cuda_graph(setup_.options.cuda_graph);
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
  // The step runner of the run's mode: pipelined, a CUDA graph, or op by op.
  std::unique_ptr<StepRunner> make_step_runner();
  // The last checkpoint this run wrote: its step (-1: none yet) and when (--checkpoint-every-min counts from
  // it, or from the start).
  struct Saved {
    int64_t step = -1;
    Clock::time_point when;
  };
  EpochEnd train_epoch(int64_t epoch, Cursor at, Saved& saved);
  // A micro-batch's loss on the host: into the report, a non-finite one (unscaled) as the error.
  void take_loss(const LossLog::Origin& at, double loss);
  void evaluate_now(int64_t epoch, int64_t step);
  Saved save(const Cursor& at);

  const RunSetup setup_;
  // What it runs with.
  const RunPlan plan_;
  const LrSchedule lr_schedule_;
  CheckpointDir checkpoints_;  // told the run's identity in start()
  data::DistributedSampler sampler_;
  Trace trace_;
  std::unique_ptr<Pipeline> pipeline_;  // with --pipeline-stages
  std::unique_ptr<Replica> replica_;
  std::unique_ptr<Reporter> reporter_;
  std::unique_ptr<StepRunner> step_;
  // Where it started, set once by start(): what every checkpoint it writes records.
  struct Origin {
    std::string run_id;                 // this run's identity
    bool steps_follow_position = true;  // false once a resume changed the global batch (TrainState)
    std::string resumed_from;
    int64_t first_step = 0;
  } origin_;
};

// The loop: from where the run starts, epochs of optimizer steps, each epoch followed by its evaluation and
// checkpoint where the cadence says; then the final checkpoint, the summary and the collective teardown.
TrainResult Run::run() {
  setup_.model.to(setup_.device);
  setup_.model.train();
  Cursor at = start();
  reporter_->announce(*replica_, setup_.threads, at, origin_.resumed_from, origin_.run_id, setup_.data.warnings());
  const Clock::time_point run_start = Clock::now();
  Saved saved{.step = -1, .when = run_start};
  origin_.first_step = at.step;
  step_ = make_step_runner();
  for (int64_t epoch = at.position.epoch; epoch < plan_.epochs && !finished(at, plan_); ++epoch) {
    const EpochEnd end = train_epoch(epoch, at, saved);
    at = end.at;
    const AfterEpoch next =
        after_epoch(setup_.options, plan_, epoch, finished(at, plan_), end.complete, saved.step == at.step);
    if (next.evaluate) evaluate_now(epoch, at.step);
    for (const std::string& w : setup_.data.take_decode_warnings())  // each rank of its own records
      std::fprintf(stderr, "%s: warning: rank %d, epoch %lld: %s; --strict refuses them\n",
                   setup_.options.program.c_str(), setup_.world.rank(), static_cast<long long>(epoch + 1), w.c_str());
    if (next.checkpoint) saved = save(at);
  }
  setup_.data.stop();
  step_->finish();
  if (at.step > origin_.first_step) save(at);  // a finished run relaunched writes nothing new
  setup_.watchdog.phase("summary (waiting for other ranks)", at.step);
  const double elapsed_s = seconds(Clock::now() - run_start);
  trace_.write(setup_.world);
  TrainResult result = reporter_->summarize({.at = at,
                                             .first_step = origin_.first_step,
                                             .elapsed_s = elapsed_s,
                                             .replica = replica_.get(),
                                             .resumed_from = origin_.resumed_from});
  // The collective teardown, on the success path only: destructors never communicate.
  setup_.watchdog.phase("closing the communicators (waiting for other ranks)", at.step);
  replica_->close();
  if (pipeline_) pipeline_->close();
  return result;
}

// Where the run starts: afresh, or from the checkpoint of --resume (its weights into the model, the
// generator's stream, the optimizer's state and loss scale into the replica). Builds the replica (rank 0's
// weights everywhere) and the reporter, and makes the checkpoint folder this run's.
Cursor Run::start() {
  std::optional<Resumed> resumed =
      resume_point(setup_.world, setup_.options, checkpoints_, plan_, setup_.data.info().signature);
  const std::vector<CheckpointDir::Entry> others = claim_folder(resumed);
  ReplicaStart from;
  if (resumed) {
    std::vector<std::string> params;
    for (const auto& [name, p] : setup_.model.named_parameters()) params.push_back(name);
    check_content(*resumed, params, setup_.options);
    origin_.steps_follow_position = !resumed->batch_changed && resumed->loaded.state.steps_follow_position;
    Checkpoint& c = resumed->loaded.checkpoint;
    try {
      setup_.model.load_state_dict(c.model);
    } catch (const std::exception& e) {
      RT_THROW_PERMANENT("--resume ", resumed->path, ": ", e.what());
    }
    c.model = {};  // the weights are in the model now
    if (resumed->loaded.state.rng_stream > 0) set_rng_stream(resumed->loaded.state.rng_stream);
    from = {.optimizer_state = &c.optimizer, .loss_scale = resumed->loaded.state.loss_scale, .from = resumed->path};
  }
  ReplicaScope scope;
  if (setup_.options.pipeline_stages > 1) {
    if (setup_.step_fn)
      RT_THROW_PERMANENT("--pipeline-stages ", setup_.options.pipeline_stages,
                         ": a custom step function (fit(model, data, ",
                         "step_fn)) sees the whole model, which no stage holds; pipelines train with the default loss");
    // The model holds its starting weights everywhere: each stage keeps its blocks' and releases the rest.
    pipeline_ = std::make_unique<Pipeline>(setup_.world, setup_.options, setup_.device, setup_.model,
                                           setup_.data.info(), setup_.watchdog, setup_.inject);
    setup_.data.set_images(setup_.grid.first());
    scope = pipeline_->scope();
    if (setup_.world.is_root()) std::printf("%s\n", pipeline_->describe().c_str());
  }
  replica_ =
      std::make_unique<Replica>(setup_.world, setup_.options, setup_.device, setup_.model, setup_.step_fn, from, scope);
  reporter_ =
      std::make_unique<Reporter>(setup_.world, setup_.options, setup_.device, plan_, replica_->sync().buckets().size(),
                                 pipeline_ ? pipeline_->plan() : json(), setup_.memory, setup_.layout_plan);
  tidy_folder(others, resumed);
  if (!resumed) return Cursor{};
  origin_.resumed_from = resumed->path;
  const Cursor at = resumed->at;
  if (setup_.world.is_root())
    std::printf("resumed from %s: step %lld, epoch %lld, batch %lld\n", origin_.resumed_from.c_str(),
                static_cast<long long>(at.step), static_cast<long long>(at.position.epoch),
                static_cast<long long>(at.position.next_batch));
  return at;
}

// The run's identity (a resumed one keeps its checkpoint's; a checkpoint from before identities existed
// makes the folder's files without one this run's too) and the folder's files that belong to another run:
// a new run refuses them unless --start-over, since its own checkpoints would replace theirs.
std::vector<CheckpointDir::Entry> Run::claim_folder(const std::optional<Resumed>& resumed) {
  const bool unmarked = resumed && resumed->loaded.state.run_id.empty();
  origin_.run_id = resumed && !unmarked ? resumed->loaded.state.run_id : "";
  if (origin_.run_id.empty())
    origin_.run_id = comm::broadcast(setup_.world.comm(), setup_.world.is_root() ? new_run_id() : std::string(), 0);
  checkpoints_.set_run(origin_.run_id, unmarked);
  if (setup_.lock) setup_.lock->set_run(origin_.run_id);
  std::vector<CheckpointDir::Entry> others;
  std::string error;
  if (setup_.world.is_root() && checkpoints_.on()) {
    error = comm::failure_of([&] { others = others_of(checkpoints_, checkpoints_.scan()); });
    if (error.empty() && !others.empty() && !setup_.options.start_over)
      error = detail::str_cat(
          "--checkpoint-dir '", checkpoints_.dir().string(),
          "' holds checkpoints of another run: ", describe_entries(others), ". This ",
          resumed ? "run (resumed from " + resumed->path + ")" : std::string("new run"),
          " would mix its checkpoints with them (--resume auto could pick theirs, --keep-last delete them): ",
          resumed ? "" : "continue that run with --resume auto, ",
          "pass --start-over to move them into a set-aside folder of it first, or use another --checkpoint-dir");
  }
  comm::agree_or_throw(setup_.world.comm(), error, "--checkpoint-dir", true);
  return others;
}

// Rank 0, once the run stands: another run's files moved aside (--start-over), and a run resumed from an
// older checkpoint of its own sets aside the later ones of the run it replaces (--resume auto must not
// continue them after a crash of this one).
void Run::tidy_folder(const std::vector<CheckpointDir::Entry>& others, const std::optional<Resumed>& resumed) {
  if (!setup_.world.is_root() || !checkpoints_.on()) return;
  if (!others.empty())
    std::fprintf(stderr, "%s: --start-over: moved %s into %s\n", setup_.options.program.c_str(),
                 describe_entries(others).c_str(), checkpoints_.move_aside(others).string().c_str());
  if (resumed && setup_.options.resume != "auto")
    for (const auto& name : checkpoints_.supersede_after(resumed->at.step))
      std::fprintf(stderr,
                   "%s: warning: set aside %s: it is newer than the resumed step %lld and belongs to the run "
                   "this one replaces\n",
                   setup_.options.program.c_str(), name.c_str(), static_cast<long long>(resumed->at.step));
}

// One epoch's optimizer steps from `at`, until the run's last step or the epoch's last complete step, each
// followed by its report and checkpoint where the cadence says.
Run::EpochEnd Run::train_epoch(int64_t epoch, Cursor at, Saved& saved) {
  sampler_.set_epoch(epoch);
  if (epoch == at.position.epoch && at.position.next_batch > 0) sampler_.restore(at.position);
  int64_t micro = sampler_.state().next_batch;  // the epoch's micro-batches taken
  if (!pipeline_ || pipeline_->reads_data()) setup_.data.start_epoch(sampler_, epoch);
  replica_->zero_grad();
  while (!finished(at, plan_)) {
    const StepRunner::End step = step_->run(epoch, at.step, micro, seconds(Clock::now() - saved.when));
    if (!step.ran) break;  // the epoch's batches ran out
    if (!step.took) reporter_->step_skipped();
    if (step.grad_norm) reporter_->add_grad_norm(*step.grad_norm);
    at = {at.step + 1, pipeline_ ? data::SamplerState{epoch, micro} : setup_.data.position()};
    const AfterStep next = after_step(setup_.options, plan_, at.step, reporter_->steps_since_report(), reporter_->bar(),
                                      step.checkpoint_asked);
    if (next.report || next.checkpoint) step_->read_losses();
    if (next.report)
      reporter_->report(epoch, at.step, lr_schedule_.at(at.step - 1),
                        pipeline_ ? pipeline_->interval_report(reporter_->steps_since_report()) : json());
    if (next.checkpoint) saved = save(at);
  }
  step_->read_losses();
  reporter_->end_epoch();
  EpochEnd end{at, !finished(at, plan_) || micro >= plan_.micro_per_epoch};
  if (end.complete) end.at.position = data::SamplerState{epoch, plan_.micro_per_epoch};
  return end;
}

void Run::take_loss(const LossLog::Origin& at, double loss) {
  // With f16 loss scaling a non-finite loss makes non-finite gradients: the scaler skips that step.
  if (!std::isfinite(loss) && !replica_->scaled())
    throw PermanentError(StepRunner::non_finite_loss(loss, at.epoch, at.step, at.micro));
  reporter_->add_loss(loss);
}

std::unique_ptr<StepRunner> Run::make_step_runner() {
  StepContext context{.world = setup_.world,
                      .options = setup_.options,
                      .device = setup_.device,
                      .watchdog = setup_.watchdog,
                      .plan = plan_,
                      .lr = lr_schedule_,
                      .inject = setup_.inject,
                      .data = setup_.data,
                      .replica = *replica_,
                      .replica_index = setup_.grid.replica,
                      .timer = reporter_->timer(),
                      .trace = trace_,
                      .first_step = origin_.first_step,
                      .take_loss = [this](const LossLog::Origin& at, double loss) { take_loss(at, loss); },
                      .write_record = [this](const json& record) { reporter_->write_record(record); }};
  if (pipeline_) return std::make_unique<PipelinedStep>(std::move(context), *pipeline_);
  if (setup_.options.cuda_graph) return std::make_unique<GraphStep>(std::move(context));
  return std::make_unique<OpByOpStep>(std::move(context));
}

void Run::evaluate_now(int64_t epoch, int64_t step) {
  data::Loader* loader = setup_.data.test_loader();
  if (!loader) return;
  replica_->average_buffers();  // without SyncBatchNorm the running statistics differ per rank
  EvalOptions eo;
  eo.batch = setup_.options.batch;
  eo.label_smoothing = setup_.options.label_smoothing;
  eo.ignore_index = setup_.options.ignore_index;
  if (setup_.data.info().segmentation) eo.classes = setup_.data.info().classes;
  eo.on_batch = [&] { setup_.watchdog.phase("evaluation", step); };
  eo.on_wait = [&] { setup_.watchdog.phase("evaluation all-reduce (waiting for other ranks)", step); };
  const EvalResult e = pipeline_ ? pipeline_->evaluate(loader, setup_.data.info().test_size, eo, step)
                                 : evaluate(setup_.model, *loader, setup_.data.info().test_size, setup_.world, eo);
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
  if (!checkpoints_.on()) return {-1, Clock::now()};
  setup_.watchdog.phase("checkpoint", at.step);
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
    if (setup_.world.is_root() || setup_.options.zero == 1) optimizer_state = replica_->optimizer_state();
    if (setup_.world.is_root()) model_state = setup_.model.state_dict();
  }
  if (setup_.world.is_root()) {
    TrainState s;
    s.step = at.step;
    s.position = at.position;
    s.world_size = setup_.world.size();
    s.global_batch = plan_.global_batch;
    s.per_step_global = plan_.per_step_global;
    s.lr = lr_schedule_.at(std::max<int64_t>(0, at.step - 1));
    s.rng_stream = rng_stream();
    if (const auto& scaler = replica_->scaler())
      s.loss_scale = LossScaleState{scaler->scale(), scaler->growth_tracker()};
    s.config = setup_.options.to_json();
    s.config["dataset"] = setup_.data.info().signature;
    s.run_id = origin_.run_id;
    s.steps_follow_position = origin_.steps_follow_position;
    SaveOptions seam{.before_rename = [&] { setup_.inject.in_checkpoint_write(setup_.world.rank(), at.step); }};
    error = comm::failure_of([&] {
      written =
          checkpoints_.save(at.step, Checkpoint{std::move(model_state), std::move(optimizer_state), s.to_json()}, seam)
              .string();
    });
  } else {
    setup_.watchdog.phase("checkpoint (waiting for other ranks: rank 0 writes it)", at.step);
  }
  comm::agree_or_throw(setup_.world.comm(), error, "writing the checkpoint");
  if (setup_.world.is_root())
    comm::supervisor_event(json{{"event", "checkpoint"}, {"step", at.step}, {"path", written}}.dump());
  return {at.step, Clock::now()};
}

// What the caller does after fit() or plan_layout() returns (or after catching their error) is no stuck
// phase: the watchdog pauses, and the run's keying of drop_path (core/ops.h sample_draws) ends.
struct AfterFit {
  explicit AfterFit(Watchdog& watchdog) : watchdog(watchdog) {}
  ~AfterFit() {
    watchdog.pause();
    set_sample_draws({});
  }
  AfterFit(const AfterFit&) = delete;
  AfterFit& operator=(const AfterFit&) = delete;
  Watchdog& watchdog;
};

}  // namespace

json Trainer::plan_layout(Module& model, DataSource& data, const LayoutWhatIf& what_if, const StepFn& step_fn) {
  watchdog_->phase("startup: planning the layout", 0);
  const AfterFit pause(*watchdog_);
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
  const AfterFit pause(*watchdog_);
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
    grid_ = permanent_errors([&] { return StageGrid::of(world_.rank(), world_.size(), o.pipeline_stages); });
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
  Run run(RunSetup{.world = world_,
                   .options = o,
                   .grid = grid_,
                   .device = device_,
                   .threads = threads_,
                   .watchdog = *watchdog_,
                   .lock = lock_.get(),
                   .model = model,
                   .data = data,
                   .step_fn = step_fn,
                   .memory = std::move(memory),
                   .layout_plan = std::move(layout)});
  return run.run();
}

}  // namespace ringtrain::runtime
