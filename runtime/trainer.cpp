// runtime/trainer.cpp: the loop. fit() builds a Run (one training run's state) and drives it: plan the run's
// length, build the optimizer and schedule, resume, connect the ranks (GradSync), then epochs of micro-batches
// and optimizer steps, with reports, evaluations and checkpoints at their cadences, and a summary.
#include "runtime/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "comm/host_collectives.h"
#include "comm/sync_batchnorm.h"
#include "comm/zero.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/optim/clip.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/optimizer.h"
#include "layers/loss.h"
#include "runtime/check_in.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/evaluate.h"
#include "runtime/fault_injection.h"
#include "runtime/gpu_telemetry.h"
#include "runtime/preflight.h"
#include "runtime/step_timer.h"
#include "runtime/trace.h"

namespace ringtrain::runtime {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------------
// Names of the choices, as the flags and the checkpoints' config spell them.

namespace {

template <typename E>
struct Named {
  const char* name;
  E value;
};

constexpr Named<OptimizerKind> kOptimizers[] = {{"sgd", OptimizerKind::Sgd}, {"adamw", OptimizerKind::AdamW}};
constexpr Named<LrShape> kShapes[] = {{"cosine", LrShape::Cosine}, {"step", LrShape::Step},
                                      {"multistep", LrShape::MultiStep}, {"constant", LrShape::Constant}};
constexpr Named<LrScaling> kScalings[] = {{"none", LrScaling::None}, {"linear", LrScaling::Linear}};
constexpr Named<Precision> kPrecisions[] = {{"fp32", Precision::FP32}, {"bf16", Precision::BF16}, {"fp16", Precision::FP16}};
constexpr Named<DeviceChoice> kDevices[] = {{"auto", DeviceChoice::Auto}, {"cpu", DeviceChoice::Cpu}, {"cuda", DeviceChoice::Cuda}};
constexpr Named<ProgressStyle> kProgress[] = {{"auto", ProgressStyle::Auto}, {"bar", ProgressStyle::Bar}, {"lines", ProgressStyle::Lines}};

template <typename E, size_t N>
const char* name_in(const Named<E> (&table)[N], E v) {
  for (const auto& n : table)
    if (n.value == v) return n.name;
  return "?";
}

template <typename E, size_t N>
E parse_in(const Named<E> (&table)[N], const std::string& text, const std::string& flag) {
  std::string names;
  for (const auto& n : table) {
    if (text == n.name) return n.value;
    names += detail::str_cat(names.empty() ? "" : ", ", n.name);
  }
  RT_THROW(flag, ": '", text, "' is not one of ", names);
}

}  // namespace

const char* name_of(OptimizerKind v) { return name_in(kOptimizers, v); }
const char* name_of(LrShape v) { return name_in(kShapes, v); }
const char* name_of(LrScaling v) { return name_in(kScalings, v); }
const char* name_of(Precision v) { return name_in(kPrecisions, v); }
const char* name_of(DeviceChoice v) { return name_in(kDevices, v); }
const char* name_of(ProgressStyle v) { return name_in(kProgress, v); }
OptimizerKind parse_optimizer(const std::string& t, const std::string& flag) { return parse_in(kOptimizers, t, flag); }
LrShape parse_lr_shape(const std::string& t, const std::string& flag) { return parse_in(kShapes, t, flag); }
LrScaling parse_lr_scaling(const std::string& t, const std::string& flag) { return parse_in(kScalings, t, flag); }
Precision parse_precision(const std::string& t, const std::string& flag) { return parse_in(kPrecisions, t, flag); }
DeviceChoice parse_device_choice(const std::string& t, const std::string& flag) { return parse_in(kDevices, t, flag); }

namespace {

const char* compression_name(comm::Compression c) {
  switch (c) {
    case comm::Compression::None: return "none";
    case comm::Compression::BF16: return "bf16";
    case comm::Compression::F16: return "fp16";
  }
  return "?";
}

}  // namespace

json TrainerOptions::to_json() const {
  json j{{"model", model_name},       {"batch_size", batch},       {"epochs", epochs},
         {"steps", steps},            {"accum_steps", accum},
         {"seed", seed},              {"optimizer", name_of(optimizer)},
         {"lr", lr},                  {"momentum", momentum},
         {"wd", wd},                  {"nesterov", nesterov},
         {"warmup_epochs", warmup_epochs}, {"lr_schedule", name_of(lr_schedule)},
         {"lr_step_epochs", lr_step_epochs}, {"lr_milestones", lr_milestones},
         {"lr_gamma", lr_gamma},      {"lr_scaling", name_of(lr_scaling)},
         {"label_smoothing", label_smoothing}, {"device", name_of(device)},
         {"precision", name_of(precision)}, {"backend", backend ? comm::backend_name(*backend) : "auto"},
         {"bucket_mb", bucket_mb},    {"compression", compression_name(compression)},
         {"sync_bn", sync_bn},        {"clip_grad_norm", clip_grad_norm}};
  for (const auto& [key, value] : app_config.items()) j[key] = value;
  return j;
}

// ---------------------------------------------------------------------------------------------------
// Construction: options checked, rank bound, generator seeded, preflight, output paths proven.

namespace {

void validate(const TrainerOptions& o) {
  auto finite = [](double v) { return std::isfinite(v); };
  RT_CHECK(o.batch >= 1, "--batch-size must be at least 1, got ", o.batch);
  RT_CHECK(o.epochs >= 1, "--epochs must be at least 1, got ", o.epochs);
  RT_CHECK(o.steps >= 0, "--steps must be 0 (off) or more, got ", o.steps);
  RT_CHECK(o.accum >= 1, "--accum-steps must be at least 1, got ", o.accum);
  RT_CHECK(finite(o.lr) && o.lr > 0, "--lr must be a positive number, got ", o.lr);
  RT_CHECK(finite(o.momentum) && o.momentum >= 0 && o.momentum <= 1, "--momentum must be in [0, 1], got ", o.momentum);
  RT_CHECK(finite(o.wd) && o.wd >= 0, "--wd must be 0 or more, got ", o.wd);
  RT_CHECK(finite(o.warmup_epochs) && o.warmup_epochs >= 0, "--warmup-epochs must be 0 or more, got ", o.warmup_epochs);
  RT_CHECK(finite(o.lr_step_epochs) && o.lr_step_epochs > 0, "--lr-step-epochs must be positive, got ", o.lr_step_epochs);
  RT_CHECK(finite(o.lr_gamma) && o.lr_gamma > 0, "--lr-gamma must be positive, got ", o.lr_gamma);
  RT_CHECK(finite(o.label_smoothing) && o.label_smoothing >= 0 && o.label_smoothing < 1,
           "--label-smoothing must be in [0, 1), got ", o.label_smoothing);
  RT_CHECK(o.threads >= 0 && o.loader_threads >= 0, "--threads and --loader-threads must be 0 (automatic) or more, got ",
           o.threads, " and ", o.loader_threads);
  RT_CHECK(finite(o.bucket_mb) && o.bucket_mb > 0, "--bucket-mb must be positive, got ", o.bucket_mb);
  RT_CHECK(o.checkpoint_every >= 0, "--checkpoint-every must be 0 (every epoch) or more, got ", o.checkpoint_every);
  RT_CHECK(finite(o.checkpoint_every_min) && o.checkpoint_every_min >= 0,
           "--checkpoint-every-min must be 0 (off) or more minutes, got ", o.checkpoint_every_min);
  RT_CHECK(o.keep_last >= 0, "--keep-last must be 0 (keep all) or more, got ", o.keep_last);
  RT_CHECK(o.eval_every >= 1 && o.log_every >= 1 && o.trace_steps >= 1,
           "--eval-every, --log-every and --trace-steps must be at least 1, got ", o.eval_every, ", ", o.log_every,
           " and ", o.trace_steps);
  RT_CHECK(finite(o.timeout) && o.timeout >= 0, "--timeout must be 0 (off) or more seconds, got ", o.timeout);
  RT_CHECK(o.resume != "auto" || !o.checkpoint_dir.empty(),
           "--resume auto needs --checkpoint-dir (the folder to take the newest checkpoint from)");
  RT_CHECK(o.checkpoint_every == 0 || !o.checkpoint_dir.empty(),
           "--checkpoint-every ", o.checkpoint_every, " needs --checkpoint-dir (where to write them)");
  RT_CHECK(o.keep_last == 0 || !o.checkpoint_dir.empty(), "--keep-last needs --checkpoint-dir");
  RT_CHECK(o.zero == 0 || o.zero == 1, "--zero must be 0 or 1, got ", o.zero);
  RT_CHECK(o.zero == 0 || o.compression == comm::Compression::None, "--zero 1 does not combine with --compression");
  RT_CHECK(finite(o.clip_grad_norm) && o.clip_grad_norm >= 0, "--clip-grad-norm must be 0 (off) or a positive norm, got ",
           o.clip_grad_norm);
  RT_CHECK(o.checkpoint_every_min == 0 || !o.checkpoint_dir.empty(),
           "--checkpoint-every-min ", o.checkpoint_every_min, " needs --checkpoint-dir (where to write them)");
}

// What every rank must agree on: the flags the checkpoints record, and whatever decides which collectives
// a rank takes part in (cadences, and whether checkpoints, the log and the trace are on).
nlohmann::json agreement(const TrainerOptions& o) {
  nlohmann::json j = o.to_json();
  j["log_every"] = o.log_every;
  j["eval_every"] = o.eval_every;
  j["checkpoint_every"] = o.checkpoint_every;
  j["checkpoint_every_min"] = o.checkpoint_every_min;
  j["zero"] = o.zero;  // the collectives of a step differ
  j["trace_steps"] = o.trace_steps;
  j["check"] = o.check;
  j["timeout"] = o.timeout;  // a watchdog of its own on some ranks but not others makes a collective differ
  for (const auto& [key, path] : {std::pair{"checkpoint_dir", &o.checkpoint_dir}, std::pair{"log_jsonl", &o.log_jsonl},
                                  std::pair{"trace", &o.trace}})
    j[key] = path->empty() ? "(unset)" : "(set)";
  return j;
}

// Where an output file goes must exist and be writable now, not after the first epoch.
std::string check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return "";
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return detail::str_cat(flag, ": folder '", parent.string(), "' of '", path, "' does not exist");
  if (::access(parent.c_str(), W_OK) != 0) return detail::str_cat(flag, ": folder '", parent.string(), "' is not writable");
  if (fs::is_directory(path, ec)) return detail::str_cat(flag, ": '", path, "' is a folder, not a file");
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0) return detail::str_cat(flag, ": '", path, "' is not writable");
  return "";
}

}  // namespace

Trainer::Trainer(comm::World& world, TrainerOptions options)
    : world_(world), options_(std::move(options)) {
  // Bad flags (and a malformed RINGTRAIN_INJECT) are refused before any work, as errors no restart fixes.
  permanent_errors([this] {
    validate(options_);
    FaultInjection::from_env();
  });
  // First of all collectives: ranks with different flags would otherwise hang in one the others skip.
  check_same_config(world_, agreement(options_));
  watchdog_ = std::make_unique<Watchdog>(world_, options_.timeout);
  watchdog_->phase("startup: binding the rank", 0);
  Device want = Device::cpu();
  if (options_.device == DeviceChoice::Cuda || (options_.device == DeviceChoice::Auto && cuda_available()))
    want = Device::cuda(0);
  const comm::DeviceBinding binding = world_.bind(want, options_.threads, options_.allow_shared_gpu);
  device_ = binding.device;
  threads_ = binding.threads;
  agree_on_device();
  manual_seed(options_.seed);  // the model built next is initialised identically on every rank
  if (options_.check) {
    const comm::Backend backend = options_.backend.value_or(comm::auto_backend(world_, device_));
    quick_preflight(world_, backend, device_);
  }
  std::string error;
  if (world_.is_root()) {
    try {
      CheckpointDir(options_.checkpoint_dir, options_.keep_last).check_writable();
    } catch (const std::exception& e) {
      error = e.what();
    }
    for (const auto& [flag, path] : {std::pair{"--log-jsonl", options_.log_jsonl}, std::pair{"--trace", options_.trace}})
      if (error.empty()) error = check_output_file(flag, path);
  }
  comm::agree_or_throw(world_.comm(), error, "checking the output paths", true);
  // What the app does next (open the data, build the model) is guarded too, under its own name.
  watchdog_->phase("startup: opening the data and building the model (before fit)", 0);
}

Trainer::~Trainer() = default;

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
// One run of fit().

namespace {

class Run {
 public:
  Run(comm::World& world, const TrainerOptions& o, Device device, int threads, Watchdog& dog, Module& model,
      DataSource& data, StepFn step_fn)
      : world_(world), o_(o), device_(device), threads_(threads), dog_(dog), model_(model), data_(data),
        step_fn_(std::move(step_fn)), root_(world.is_root()), ckpt_(o.checkpoint_dir, o.keep_last),
        log_(o.log_jsonl, world.is_root()), trace_(o.trace, o.trace_steps), inject_(FaultInjection::from_env()) {}

  TrainResult run();

 private:
  void plan_length();
  void make_optimizer();
  void resume();
  void compare_config(const json& written, const std::string& file) const;
  void connect();
  void announce();
  bool run_epoch(int64_t epoch);
  void micro_step(const data::Batch& batch, bool last_micro, Clock::time_point t0, Clock::time_point t1);
  void optimizer_step();
  void report(int64_t epoch, bool finishing);
  void evaluate_now(int64_t epoch);
  void save(int64_t at_step, const data::SamplerState& pos);
  TrainResult summarize();

  comm::World& world_;
  const TrainerOptions& o_;
  Device device_;
  int threads_;
  Watchdog& dog_;
  Module& model_;
  DataSource& data_;
  StepFn step_fn_;
  bool root_;
  CheckpointDir ckpt_;
  RunLog log_;
  Trace trace_;
  FaultInjection inject_;
  std::optional<DType> autocast_;
  CrossEntropyLoss loss_fn_{0.0};

  // The run's shape.
  int64_t per_step_global_ = 0, global_batch_ = 0, steps_per_epoch_ = 0, micro_limit_ = 0, total_steps_ = 0, epochs_ = 0;
  double lr_ = 0;
  std::unique_ptr<data::DistributedSampler> sampler_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<Optimizer> opt_;
  comm::ZeroOptimizer* zero_ = nullptr;     // opt_ when --zero 1
  comm::ZeroOptimizer::Factory make_rule_;  // the update rule over some parameters (ZeRO: this rank's pieces)
  std::optional<std::vector<std::pair<std::string, Tensor>>> resumed_optimizer_;  // ZeRO: loaded after connect
  std::optional<GradScaler> scaler_;
  std::vector<Tensor> parameters_;
  // Connection.
  comm::Backend backend_ = comm::Backend::Ring;
  comm::CommunicatorPtr comm_, bn_comm_;
  std::unique_ptr<comm::GradSync> sync_;
  uint64_t plan_ = 0;
  std::unique_ptr<GpuTelemetry> gpu_;
  bool bar_ = false;
  // Progress.
  int64_t step_ = 0, first_step_ = 0, micro_ = 0, in_accum_ = 0, skipped_ = 0, images_ = 0;
  data::SamplerState position_, last_position_;  // where the run starts; where the next step would start
  std::string resumed_from_;
  int64_t mine_step_ = 0;  // the step of the checkpoint being resumed
  StepTimer timer_;
  Clock::time_point step_begin_, run_start_, interval_start_;
  Clock::time_point last_save_;  // rank 0's clock: --checkpoint-every-min counts from here
  bool save_due_ = false;        // rank 0 asked for a time-based checkpoint at the last check-in
  int64_t saved_step_ = -1;      // the step of the last checkpoint this run wrote
  Clock::time_point backward_start_, backward_end_;  // of the last micro-batch
  double interval_loss_ = 0, interval_weight_ = 0, last_loss_ = 0;
  double grad_norm_ = 0;  // before clipping, of the last step (with --clip-grad-norm)
  std::optional<EvalResult> last_eval_;
};

void Run::plan_length() {
  const DataInfo& info = data_.info();
  per_step_global_ = o_.batch * world_.size();
  global_batch_ = per_step_global_ * o_.accum;
  data::SamplerOptions so;
  so.dataset_size = info.train_size;
  so.global_batch = per_step_global_;
  so.rank = world_.rank();
  so.world_size = world_.size();
  so.seed = o_.seed;
  so.chunk = info.chunk;
  sampler_ = std::make_unique<data::DistributedSampler>(so);
  steps_per_epoch_ = sampler_->batches_per_epoch() / o_.accum;
  RT_CHECK(steps_per_epoch_ > 0, "--batch-size ", o_.batch, " x ", world_.size(), " ranks x --accum-steps ", o_.accum,
           " = global batch ", global_batch_, " is larger than the training split (", info.train_size, " records)");
  // An epoch is steps_per_epoch * accum micro-batches: a leftover that cannot fill a step is not run.
  micro_limit_ = steps_per_epoch_ * o_.accum;
  total_steps_ = o_.steps > 0 ? o_.steps : steps_per_epoch_ * o_.epochs;
  epochs_ = o_.steps > 0 ? (total_steps_ + steps_per_epoch_ - 1) / steps_per_epoch_ : o_.epochs;
}

std::vector<double> parse_milestones(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    RT_CHECK(used == item.size() && used > 0 && std::isfinite(v) && v >= 0,
             "--lr-milestones: expected comma-separated epochs, got '", text, "'");
    out.push_back(v);
  }
  return out;
}

void Run::make_optimizer() {
  lr_ = o_.lr;
  if (o_.lr_scaling == LrScaling::Linear) lr_ *= static_cast<double>(global_batch_) / 256.0;
  LrScheduleOptions lso;
  lso.base_lr = lr_;
  lso.total_steps = total_steps_;
  lso.warmup_steps = static_cast<int64_t>(o_.warmup_epochs * static_cast<double>(steps_per_epoch_));
  lso.gamma = o_.lr_gamma;
  lso.shape = o_.lr_schedule;
  if (o_.lr_schedule == LrShape::Step)
    lso.step_size = std::max<int64_t>(1, static_cast<int64_t>(o_.lr_step_epochs * static_cast<double>(steps_per_epoch_)));
  if (o_.lr_schedule == LrShape::MultiStep) {
    const double e = static_cast<double>(epochs_);
    const std::vector<double> m = o_.lr_milestones.empty() ? std::vector<double>{0.5 * e, 0.75 * e}
                                                           : parse_milestones(o_.lr_milestones);
    for (double epoch : m) lso.milestones.push_back(static_cast<int64_t>(epoch * static_cast<double>(steps_per_epoch_)));
    for (size_t i = 1; i < lso.milestones.size(); ++i)
      RT_CHECK(lso.milestones[i] > lso.milestones[i - 1], "--lr-milestones must be increasing epochs, got '",
               o_.lr_milestones, "'");
  }
  RT_CHECK(lso.warmup_steps < total_steps_ || lso.shape != LrShape::Cosine, "--warmup-epochs ", o_.warmup_epochs, " (",
           lso.warmup_steps, " steps) must end before the run does (", total_steps_, " steps)");
  schedule_ = std::make_unique<LrSchedule>(lso);
  auto named = as_named(model_.named_parameters());
  make_rule_ = [o = o_](std::vector<NamedParameter> params) -> std::unique_ptr<Optimizer> {
    if (o.optimizer == OptimizerKind::Sgd)
      return std::make_unique<Sgd>(std::move(params),
                                   SgdOptions{.momentum = o.momentum, .nesterov = o.nesterov, .weight_decay = o.wd});
    return std::make_unique<AdamW>(std::move(params), AdamWOptions{.weight_decay = o.wd});
  };
  if (o_.zero == 0) opt_ = make_rule_(named);  // ZeRO: made in connect(), over this rank's shard
  for (const auto& p : named) parameters_.push_back(p.tensor);
  if (o_.precision == Precision::FP16) scaler_.emplace();
  if (o_.precision != Precision::FP32) autocast_ = o_.precision == Precision::BF16 ? DType::BF16 : DType::F16;
  loss_fn_ = CrossEntropyLoss(o_.label_smoothing);
  if (root_ && autocast_ && device_.is_cpu())
    std::printf("note: --precision %s on the CPU runs 16-bit convolutions through f32 kernels: correct, not faster\n",
                name_of(o_.precision));
}

// Rank 0 picks the checkpoint; every rank loads it (a folder every rank can read). GradSync, built next,
// then checks that every rank holds the same weights.
void Run::resume() {
  std::optional<CheckpointDir::Loaded> mine;
  std::string chosen;
  if (root_) {
    for (const auto& name : ckpt_.remove_stale_temp_files())
      std::fprintf(stderr, "%s: removed '%s' (left by an interrupted checkpoint write)\n", o_.program.c_str(), name.c_str());
    if (o_.resume == "auto") {
      mine = ckpt_.load_newest([&](const std::string& w) { std::fprintf(stderr, "%s: warning: %s\n", o_.program.c_str(), w.c_str()); });
      if (mine) chosen = mine->path.string();
    } else {
      chosen = o_.resume;
    }
  }
  chosen = comm::broadcast(world_.comm(), chosen, 0);
  if (chosen.empty()) return;
  std::string error;
  try {
    RT_CHECK(fs::exists(chosen), "checkpoint '", chosen, "' does not exist here (every rank must be able to read the ",
             "checkpoint folder)");
    if (!mine) mine = CheckpointDir::load(chosen);
  } catch (const std::exception& e) {
    error = e.what();
  }
  comm::agree_or_throw(world_.comm(), error, "--resume", true);
  const TrainState& s = mine->state;
  const bool batch_changed = s.global_batch != global_batch_;
  const std::string written_batch = detail::str_cat(s.global_batch, " (", s.world_size, " ranks x batch ",
                                                    s.config.value("batch_size", json(-1)).dump(), " x accum ",
                                                    s.config.value("accum_steps", json(-1)).dump(), ")");
  if (batch_changed && !o_.allow_batch_change)
    RT_THROW_PERMANENT("--resume ", chosen, ": the checkpoint was written with global batch ", written_batch,
                       "; resume with the same global batch (now ", global_batch_, "), or pass --allow-batch-change");
  if (batch_changed && root_)
    std::fprintf(stderr, "%s: warning: --allow-batch-change: resuming %s, written with global batch %s, at global "
                 "batch %lld: from here this is another training than the checkpoint's\n", o_.program.c_str(),
                 chosen.c_str(), written_batch.c_str(), static_cast<long long>(global_batch_));
  mine_step_ = s.step;
  permanent_errors([&] { compare_config(s.config, chosen); });
  try {
    model_.load_state_dict(mine->checkpoint.model);
    if (opt_) opt_->load_state(mine->checkpoint.optimizer);
    else resumed_optimizer_ = mine->checkpoint.optimizer;  // the canonical state, sliced once the shards exist
  } catch (const std::exception& e) {
    RT_THROW_PERMANENT("--resume ", chosen, ": ", e.what());
  }
  if (scaler_ && s.loss_scale) scaler_->load(s.loss_scale->scale, s.loss_scale->growth_tracker);
  if (s.rng_stream > 0) set_rng_stream(s.rng_stream);
  step_ = s.step;
  position_ = permanent_errors([&] { return s.position_for(per_step_global_, micro_limit_, chosen, batch_changed); });
  resumed_from_ = chosen;
  // Later checkpoints in this run's folder belong to the run being replaced: --resume auto must not
  // continue them after a crash of this one.
  if (root_ && o_.resume != "auto")
    for (const auto& name : ckpt_.supersede_after(step_))
      std::fprintf(stderr, "%s: warning: set aside %s: it is newer than the resumed step %lld and belongs to the run "
                   "this one replaces\n", o_.program.c_str(), name.c_str(), static_cast<long long>(step_));
  if (root_)
    std::printf("resumed from %s: step %lld, epoch %lld, batch %lld\n", chosen.c_str(), static_cast<long long>(step_),
                static_cast<long long>(position_.epoch), static_cast<long long>(position_.next_batch));
}

// A resume that changes what is trained is refused; one that changes the run's length or schedule is
// allowed (extending a run is common) but said, since e.g. a cosine schedule then jumps.
void Run::compare_config(const json& written, const std::string& file) const {
  json now = o_.to_json();
  now["dataset"] = data_.info().signature;
  auto differs = [&](const char* key) { return written.contains(key) && now.contains(key) && written[key] != now[key]; };
  for (const char* key : {"arch", "model", "optimizer", "dataset"})
    if (differs(key)) {
      const std::string what = std::string(key) == "dataset" ? "the dataset" : flag_of(key);
      RT_THROW("--resume ", file, ": the checkpoint was written with ", what, " ", written[key].dump(),
               " but this run has ", now[key].dump(), "; resuming would not continue that training (start a new ",
               "run, or resume with the same ", what, ")");
    }
  std::string changed;
  for (const char* key : {"steps", "epochs", "lr", "lr_schedule", "warmup_epochs", "lr_step_epochs", "lr_milestones",
                          "lr_gamma", "lr_scaling", "momentum", "wd", "label_smoothing", "precision", "clip_grad_norm"})
    if (differs(key))
      changed += detail::str_cat(changed.empty() ? "" : ", ", flag_of(key), " ", written[key].dump(), " -> ", now[key].dump());
  if (!changed.empty() && root_)
    std::fprintf(stderr, "%s: warning: resuming %s with another run length or schedule than it was written with (%s): "
                 "the learning rate continues from this run's schedule at step %lld\n",
                 o_.program.c_str(), file.c_str(), changed.c_str(), static_cast<long long>(mine_step_));
}

void Run::connect() {
  backend_ = o_.backend.value_or(comm::auto_backend(world_, device_));
  comm_ = comm::make_communicator(backend_, world_.comm());
  // SyncBatchNorm's all-reduces on a communicator of their own: they must not queue behind gradient buckets.
  if (o_.sync_bn) {
    bn_comm_ = comm::make_communicator(backend_, world_.comm());
    comm::convert_sync_batchnorm(model_, bn_comm_);
  }
  comm::GradSyncOptions gso;
  gso.bucket_mb = o_.bucket_mb;
  gso.compression = o_.compression;
  if (root_ && o_.compression == comm::Compression::F16 && o_.precision != Precision::FP16)
    std::fprintf(stderr, "%s: warning: --compression fp16 without --precision fp16 sends unscaled gradients as fp16, "
                         "where values below 6e-8 flush to zero and above 65504 overflow; bf16 keeps fp32's range\n",
                 o_.program.c_str());
  gso.zero_stage = o_.zero;
  sync_ = std::make_unique<comm::GradSync>(model_, comm_, gso);  // rank 0's (possibly resumed) weights everywhere
  if (o_.zero == 1) {
    auto zero = std::make_unique<comm::ZeroOptimizer>(*sync_, make_rule_);
    zero_ = zero.get();
    opt_ = std::move(zero);
    if (resumed_optimizer_) {
      try {
        opt_->load_state(*resumed_optimizer_);
      } catch (const std::exception& e) {
        RT_THROW_PERMANENT("--resume ", resumed_from_, ": ", e.what());
      }
      resumed_optimizer_.reset();
    }
  }
  plan_ = bucket_plan_hash(sync_->buckets());
  timer_ = StepTimer(sync_->buckets().size());
  gpu_ = std::make_unique<GpuTelemetry>(world_, device_, !o_.log_jsonl.empty());
  bar_ = use_progress_bar(world_, o_.progress);
}

void Run::announce() {
  if (root_)
    for (const auto& w : data_.warnings()) std::fprintf(stderr, "%s: warning: %s\n", o_.program.c_str(), w.c_str());
  if (root_) {
    std::printf("%s: %s on %s, %d rank(s) on %d node(s), %s backend, batch %lld/rank x %lld accum = %lld global, "
                "%lld steps/epoch, %lld steps, lr %.4g (%s)%s\n",
                o_.program.c_str(), o_.model_name.c_str(), device_.str().c_str(), world_.size(), world_.num_nodes(),
                comm::backend_name(backend_), static_cast<long long>(o_.batch), static_cast<long long>(o_.accum),
                static_cast<long long>(global_batch_), static_cast<long long>(steps_per_epoch_),
                static_cast<long long>(total_steps_), lr_, name_of(o_.lr_schedule),
                o_.compression == comm::Compression::None
                    ? ""
                    : detail::str_cat(", gradients travel as ", compression_name(o_.compression)).c_str());
    std::fflush(stdout);
  }
  // What scripts/scaling_model.py needs besides the timings: the run's shape and its bucket plan.
  if (root_)
    comm::supervisor_event(json{{"event", "plan"}, {"world_size", world_.size()}, {"nodes", world_.num_nodes()},
                                {"batch_size", o_.batch}, {"accum_steps", o_.accum}, {"global_batch", global_batch_},
                                {"step", step_}, {"total_steps", total_steps_}, {"resumed_from", resumed_from_},
                                {"checkpoint_dir", o_.checkpoint_dir}}
                               .dump());
  const int64_t state_bytes = opt_->state_bytes();
  log_.write(plan_record({.world_size = world_.size(), .nodes = world_.num_nodes(), .threads = threads_,
                          .arch = o_.model_name, .backend = comm::backend_name(backend_), .device = device_.str(),
                          .batch_size = o_.batch, .accum_steps = o_.accum, .global_batch = global_batch_,
                          .buckets = sync_->buckets(), .zero = o_.zero,
                          .optimizer_state_bytes = comm::all_gather(world_.comm(), std::span<const int64_t>(&state_bytes, 1))}));
}

TrainResult Run::run() {
  model_.to(device_);
  model_.train();
  permanent_errors([this] {  // errors of the flags against the data
    plan_length();
    make_optimizer();
  });
  resume();
  connect();
  announce();
  run_start_ = interval_start_ = last_save_ = Clock::now();
  first_step_ = step_;
  last_position_ = position_;
  bool done = step_ >= total_steps_;
  for (int64_t epoch = position_.epoch; epoch < epochs_ && !done; ++epoch) done = run_epoch(epoch);
  data_.stop();
  if (step_ > first_step_) save(step_, last_position_);  // a finished run relaunched writes nothing new
  TrainResult result = summarize();
  // The collective teardown, on the success path only: destructors never communicate.
  dog_.phase("closing the communicators (waiting for other ranks)", step_);
  sync_->wait_parameters();  // the model stays usable after the run
  sync_.reset();
  comm_->close();
  if (bn_comm_) {
    comm::revert_sync_batchnorm(model_);  // the model stays usable after the run, with local statistics
    bn_comm_->close();
  }
  return result;
}

// One epoch of micro-batches; returns true when the run is done.
bool Run::run_epoch(int64_t epoch) {
  sampler_->set_epoch(epoch);
  if (epoch == position_.epoch && position_.next_batch > 0) sampler_->restore(position_);
  micro_ = sampler_->state().next_batch;
  data_.start_epoch(*sampler_, epoch);
  in_accum_ = 0;
  sync_->zero_grad();
  bool done = false;
  for (;;) {
    const auto t0 = Clock::now();
    if (in_accum_ == 0) step_begin_ = t0;
    dog_.phase("data loading", step_);
    if (micro_ >= micro_limit_) break;
    std::optional<data::Batch> batch = data_.next();
    if (!batch) break;
    ++micro_;
    const bool last_micro = in_accum_ + 1 == o_.accum;
    micro_step(*batch, last_micro, t0, Clock::now());
    if (!last_micro) {
      ++in_accum_;
      continue;
    }
    in_accum_ = 0;
    optimizer_step();
    last_position_ = data_.position();
    const bool finishing = step_ >= total_steps_;
    report(epoch, finishing);
    if (((o_.checkpoint_every > 0 && step_ % o_.checkpoint_every == 0) || save_due_) && !finishing)
      save(step_, last_position_);
    if (finishing) {
      done = true;
      break;
    }
  }
  if (bar_ && root_) std::printf("\n");
  const bool epoch_complete = !done || micro_ >= micro_limit_;
  if (epoch_complete) last_position_ = data::SamplerState{epoch, micro_limit_};
  if ((epoch + 1) % o_.eval_every == 0 || done || epoch + 1 == epochs_) evaluate_now(epoch);
  // (A time-based checkpoint may have been written at this very step already.)
  if (o_.checkpoint_every == 0 && epoch_complete && !done && saved_step_ != step_) save(step_, last_position_);
  return done;
}

// Forward and backward of one micro-batch (t0: its data wait began, t1: the batch arrived).
void Run::micro_step(const data::Batch& batch, bool last_micro, Clock::time_point t0, Clock::time_point t1) {
  dog_.phase("forward", step_);
  Tensor loss;
  {
    AutocastGuard autocast_scope(autocast_);
    loss = step_fn_ ? step_fn_(model_, batch) : loss_fn_(model_(batch.images), batch.labels);
  }
  if (!loss.defined() || loss.numel() != 1)
    RT_THROW_PERMANENT("the step function must return a scalar loss, got ",
                       loss.defined() ? loss.describe() : std::string("an undefined tensor"));
  const double loss_value = loss.item();
  // With f16 loss scaling a non-finite loss makes non-finite gradients: the scaler skips that step.
  if (!std::isfinite(loss_value) && !scaler_)
    RT_THROW_PERMANENT("non-finite loss (", loss_value, ") at step ", step_, " (epoch ", sampler_->state().epoch,
             ", micro-batch ", micro_ - 1, "): lower --lr, add --warmup-epochs, or check the data");
  const auto t2 = Clock::now();
  dog_.phase("backward", step_);
  Tensor objective = o_.accum > 1 ? mul(loss, 1.0 / static_cast<double>(o_.accum)) : loss;
  if (scaler_) objective = scaler_->scale_loss(objective);
  if (!last_micro) {
    auto guard = sync_->no_sync();
    objective.backward();
  } else {
    objective.backward();
  }
  const auto t3 = Clock::now();
  PhaseTimes& now = timer_.current();
  now.data_wait += std::chrono::duration<double>(t1 - t0).count();
  now.forward += std::chrono::duration<double>(t2 - t1).count();
  now.backward += std::chrono::duration<double>(t3 - t2).count();
  if (std::isfinite(loss_value)) {
    interval_loss_ += loss_value / static_cast<double>(o_.accum);
    interval_weight_ += 1.0 / static_cast<double>(o_.accum);
    last_loss_ = loss_value;
  }
  trace_.span("data_wait", t0, t1, step_);
  trace_.span("forward", t1, t2, step_);
  trace_.span("backward", t2, t3, step_);
  backward_start_ = t2;
  backward_end_ = t3;
}

// The gradient all-reduce's end, the optimizer step, the fault seam and the check-in.
void Run::optimizer_step() {
  dog_.phase("gradient all-reduce (waiting for other ranks)", step_);
  sync_->finish();
  const auto t4 = Clock::now();
  dog_.phase("optimizer", step_);
  // The gradients are averaged already, so every rank takes the same decisions. With ZeRO-1 each rank holds
  // its shard of them: the finite check and the norm combine over the shards (one small all-reduce each).
  const std::vector<Tensor>& held = zero_ ? zero_->shard_parameters() : parameters_;
  const GradientParts* parts = zero_;
  bool take = !scaler_ || scaler_->unscale(held, parts);
  if (take && o_.clip_grad_norm > 0) {
    grad_norm_ = clip_grad_norm(held, o_.clip_grad_norm, parts);
    if (!std::isfinite(grad_norm_))
      RT_THROW_PERMANENT("non-finite gradient norm (", grad_norm_, ") at step ", step_,
                         ": lower --lr, add --warmup-epochs, or check the data");
  }
  if (take) opt_->step(schedule_->at(step_));
  if (scaler_) {
    scaler_->update(!take);
    if (!take) {
      ++skipped_;
      if (scaler_->scale() < 1e-4)
        RT_THROW_PERMANENT("f16 loss scale fell to ", scaler_->scale(), " at step ", step_,
                           ": the gradients are not finite at any scale (diverged); lower --lr or use --precision bf16");
    }
  }
  sync_->zero_grad();
  const auto t_opt = Clock::now();
  ++step_;
  if (inject_.fires(world_.rank(), step_)) dog_.phase("injected fault (RINGTRAIN_INJECT)", step_);
  const int64_t reported = inject_.after_step(world_.rank(), step_);
  dog_.phase("step check-in (waiting for other ranks)", step_);
  // --checkpoint-every-min: rank 0's clock decides, and its decision reaches every rank in the check-in.
  const bool want_save = root_ && o_.checkpoint_every_min > 0 &&
                         std::chrono::duration<double>(Clock::now() - last_save_).count() >= 60 * o_.checkpoint_every_min;
  save_due_ = check_in_step(world_, reported, plan_, want_save ? 1 : 0) > 0;
  const auto t5 = Clock::now();
  if (root_) comm::supervisor_event(json{{"event", "step"}, {"step", step_}}.dump());
  trace_.span("exposed_comm", backward_end_, t4, step_ - 1);
  for (const auto& b : sync_->last_bucket_timings())
    trace_.span(detail::str_cat("allreduce bucket ", b.bucket), b.begin, b.end, step_ - 1, 1);
  trace_.span("optimizer", t4, t_opt, step_ - 1);
  trace_.span("step check-in", t_opt, t5, step_ - 1);
  // The check-in waits for the slowest rank: exposed communication, not optimizer time.
  PhaseTimes& now = timer_.current();
  now.exposed_comm = std::chrono::duration<double>(t4 - backward_end_).count() +
                     std::chrono::duration<double>(t5 - t_opt).count();
  now.optimizer = std::chrono::duration<double>(t_opt - t4).count();
  // The run's first step (allocations, caches) stays out of the breakdown, unless it is the only one.
  const bool counts = step_ > first_step_ + 1 || total_steps_ - first_step_ == 1;
  timer_.end_step(std::chrono::duration<double>(t5 - step_begin_).count(), counts, backward_start_,
                  sync_->last_bucket_timings());
  images_ += global_batch_;
}

// Progress line, train record and GPU record every --log-every steps (every step with the bar), and at the end.
void Run::report(int64_t epoch, bool finishing) {
  if (timer_.interval_steps() < o_.log_every && !finishing && !bar_) return;
  double stats[2] = {interval_loss_, interval_weight_};  // the loss averaged over ranks
  comm::all_reduce(world_.comm(), std::span<double>(stats, 2));
  const double mean_loss = stats[0] / stats[1];
  const double seconds = std::chrono::duration<double>(Clock::now() - interval_start_).count();
  const auto n = static_cast<double>(timer_.interval_steps());
  const double img_s = n * static_cast<double>(global_batch_) / seconds;
  if (root_) {
    ProgressLine line{.epoch = epoch, .epochs = epochs_, .step = step_, .total_steps = total_steps_,
                      .step_in_epoch = (step_ - 1) % steps_per_epoch_ + 1, .steps_per_epoch = steps_per_epoch_,
                      .loss = mean_loss, .lr = schedule_->at(step_ - 1), .img_per_s = img_s,
                      .eta_s = static_cast<double>(total_steps_ - step_) * seconds / n};
    print_progress(bar_, line);
    log_.write(train_record({.step = step_, .epoch = epoch, .lr = line.lr, .loss = mean_loss, .img_per_s = img_s,
                             .time = timer_.interval_mean(),
                             .grad_norm = o_.clip_grad_norm > 0 ? std::optional<double>(grad_norm_) : std::nullopt}));
  }
  if (auto record = gpu_->sample(step_)) log_.write(*record);
  timer_.reset_interval();
  interval_loss_ = interval_weight_ = 0;
  interval_start_ = Clock::now();
}

void Run::evaluate_now(int64_t epoch) {
  data::Loader* loader = data_.test_loader();
  if (!loader) return;
  // Without SyncBatchNorm the running statistics differ per rank: evaluate with their average.
  if (!o_.sync_bn && world_.size() > 1) sync_->average_buffers();
  EvalOptions eo;
  eo.batch = o_.batch;
  eo.label_smoothing = o_.label_smoothing;
  eo.on_batch = [&] { dog_.phase("evaluation", step_); };
  eo.on_wait = [&] { dog_.phase("evaluation all-reduce (waiting for other ranks)", step_); };
  last_eval_ = evaluate(model_, *loader, data_.info().test_size, world_, eo);
  if (!root_) return;
  std::printf("epoch %lld: test top-1 %.2f%%  top-5 %.2f%%  loss %.4f  (%lld images)\n",
              static_cast<long long>(epoch + 1), 100 * last_eval_->top1, 100 * last_eval_->top5, last_eval_->loss,
              static_cast<long long>(last_eval_->count));
  std::fflush(stdout);
  log_.write(eval_record(step_, epoch, *last_eval_));
}

void Run::save(int64_t at_step, const data::SamplerState& pos) {
  if (!ckpt_.on()) return;
  dog_.phase("checkpoint", at_step);
  sync_->wait_parameters();  // ZeRO-1: the last step's all-gather, left to the next forward
  // Rank 0's file must describe every rank: BatchNorm running statistics (per rank without SyncBN) are
  // averaged first, so a resumed run (which starts every rank from the file) continues exactly.
  if (!o_.sync_bn && world_.size() > 1) sync_->average_buffers();
  std::string error, written;
  // ZeRO: gathering the sharded state to rank 0 is collective.
  std::vector<std::pair<std::string, Tensor>> optimizer_state;
  if (root_ || o_.zero == 1) optimizer_state = opt_->state();
  if (root_) {
    TrainState s;
    s.step = at_step;
    s.position = pos;
    s.world_size = world_.size();
    s.global_batch = global_batch_;
    s.per_step_global = per_step_global_;
    s.lr = schedule_->at(std::max<int64_t>(0, at_step - 1));
    s.rng_stream = rng_stream();
    if (scaler_) s.loss_scale = LossScaleState{scaler_->scale(), scaler_->growth_tracker()};
    s.config = o_.to_json();
    s.config["dataset"] = data_.info().signature;
    SaveOptions seam{.before_rename = [&] { inject_.in_checkpoint_write(world_.rank(), at_step); }};
    try {
      written = ckpt_.save(at_step, Checkpoint{model_.state_dict(), std::move(optimizer_state), s.to_json()}, seam).string();
    } catch (const std::exception& e) {
      error = e.what();
    }
  } else {
    dog_.phase("checkpoint (waiting for other ranks: rank 0 writes it)", at_step);
  }
  comm::agree_or_throw(world_.comm(), error, "writing the checkpoint");
  last_save_ = Clock::now();
  saved_step_ = at_step;
  if (root_) comm::supervisor_event(json{{"event", "checkpoint"}, {"step", at_step}, {"path", written}}.dump());
}

TrainResult Run::summarize() {
  dog_.phase("summary (waiting for other ranks)", step_);
  TrainResult r;
  r.elapsed_s = std::chrono::duration<double>(Clock::now() - run_start_).count();
  r.steps = step_;
  r.steps_run = step_ - first_step_;
  r.train_loss = last_loss_;
  r.eval = last_eval_;
  r.img_per_s = static_cast<double>(images_) / r.elapsed_s;
  r.median_step_s = timer_.median_step_s();
  r.skipped_steps = skipped_;
  r.resumed_from = resumed_from_;
  const double my_peak = peak_rss_bytes();
  const std::vector<double> peaks = comm::gather(world_.comm(), std::span<const double>(&my_peak, 1));  // rank 0's
  // On a GPU: the caching allocator's high-water mark of memory obtained from the device (what PyTorch's
  // max_memory_reserved reports), the largest over the ranks.
  const double peak_gpu = comm::all_reduce(
      world_.comm(), device_.is_cuda() ? static_cast<double>(memory_stats(device_).peak_reserved_bytes) : 0.0,
      comm::HostOp::Max);
  // Every rank's mean breakdown: a synchronous step goes at the pace of the slowest rank, and rank 0's
  // exposed_comm includes waiting for it; the scaling model needs to tell the two apart.
  double mine[PhaseTimes::kCount];
  timer_.breakdown_mean().to_array(mine);
  const std::vector<double> all = comm::gather(world_.comm(), std::span<const double>(mine, PhaseTimes::kCount));
  trace_.write(world_);
  if (!root_) return r;
  SummaryRecord s;
  s.train_loss = last_loss_;
  s.img_per_s = r.img_per_s;
  s.median_step_s = r.median_step_s;
  s.peak_mem_bytes = *std::max_element(peaks.begin(), peaks.end());
  s.peak_mem_bytes_by_rank = peaks;
  s.elapsed_s = r.elapsed_s;
  s.world_size = world_.size();
  s.steps = step_;
  s.breakdown_steps = timer_.breakdown_steps();
  s.breakdown = timer_.breakdown_mean();
  for (int k = 0; k < world_.size(); ++k)
    s.breakdown_by_rank.push_back(PhaseTimes::from_array(all.data() + PhaseTimes::kCount * static_cast<size_t>(k)));
  for (size_t i = 0; i < sync_->buckets().size(); ++i)
    s.buckets.push_back({sync_->buckets()[i].bytes, timer_.bucket_ready_s(i), timer_.bucket_allreduce_s(i)});
  s.precision = name_of(o_.precision);
  s.device = device_.str();
  s.eval = last_eval_;
  if (scaler_) {
    s.loss_scale = scaler_->scale();
    s.skipped_steps = skipped_;
  }
  if (device_.is_cuda()) {
    s.peak_gpu_mem_bytes = peak_gpu;
    s.cudnn_conv_algorithms = cuda_conv_algorithms();  // rank 0's choices, one per pass and shape
  }
  log_.write(summary_record(s));
  std::printf("done: %lld steps in %s, %.0f img/s, final train loss %.4f", static_cast<long long>(step_),
              format_duration(r.elapsed_s).c_str(), r.img_per_s, last_loss_);
  if (last_eval_) std::printf(", test top-1 %.2f%% top-5 %.2f%%", 100 * last_eval_->top1, 100 * last_eval_->top5);
  std::printf("\n");
  std::fflush(stdout);
  return r;
}

}  // namespace

TrainResult Trainer::fit(Module& model, DataSource& data, const StepFn& step_fn) {
  watchdog_->phase("startup: preparing the run", 0);
  // The caller's work after the run (or after catching its error) is not a stuck phase.
  struct Pause {
    Watchdog& dog;
    ~Pause() { dog.pause(); }
  } pause{*watchdog_};
  Run run(world_, options_, device_, threads_, *watchdog_, model, data, step_fn);
  return run.run();
}

}  // namespace ringtrain::runtime
