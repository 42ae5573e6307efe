// runtime/config/options.cpp: the names of the options' enums, their JSON form, their checks and the ranks'
// agreement.
#include "runtime/config/options.h"

#include "runtime/cluster/gpu_choice.h"

#include <cmath>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/check.h"
#include "io/files.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------
// Names of the choices, as the flags and the checkpoints' config spell them.

namespace {

template <typename E>
struct Named {
  const char* name;
  E value;
};

constexpr Named<OptimizerKind> kOptimizers[] = {{"sgd", OptimizerKind::Sgd}, {"adamw", OptimizerKind::AdamW}};
constexpr Named<LrShape> kShapes[] = {{"cosine", LrShape::Cosine},
                                      {"step", LrShape::Step},
                                      {"multistep", LrShape::MultiStep},
                                      {"constant", LrShape::Constant}};
constexpr Named<LrScaling> kScalings[] = {{"none", LrScaling::None}, {"linear", LrScaling::Linear}};
constexpr Named<Precision> kPrecisions[] = {
    {"fp32", Precision::FP32}, {"bf16", Precision::BF16}, {"fp16", Precision::FP16}};
constexpr Named<DeviceChoice> kDevices[] = {
    {"auto", DeviceChoice::Auto}, {"cpu", DeviceChoice::Cpu}, {"cuda", DeviceChoice::Cuda}};
constexpr Named<bool> kOnOff[] = {{"on", true}, {"off", false}};
constexpr Named<ProgressStyle> kProgress[] = {
    {"auto", ProgressStyle::Auto}, {"bar", ProgressStyle::Bar}, {"lines", ProgressStyle::Lines}};

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
const char* name_of(PipelineSchedule s) { return s == PipelineSchedule::GPipe ? "gpipe" : "1f1b"; }
const char* name_of(PipelineBalance b) { return b == PipelineBalance::Memory ? "memory" : "time"; }

ProgressStyle parse_progress(const std::string& text) {
  if (text == "auto") return ProgressStyle::Auto;
  if (text == "bar") return ProgressStyle::Bar;
  if (text == "lines") return ProgressStyle::Lines;
  RT_THROW("--progress must be auto, bar or lines, got '", text, "'");
}

PipelineSchedule parse_pipeline_schedule(const std::string& text, const std::string& flag) {
  if (text == "1f1b") return PipelineSchedule::OneFOneB;
  if (text == "gpipe") return PipelineSchedule::GPipe;
  RT_THROW(flag, ": '", text, "' is not one of 1f1b, gpipe");
}

PipelineBalance parse_pipeline_balance(const std::string& text, const std::string& flag) {
  if (text == "time") return PipelineBalance::Time;
  if (text == "memory") return PipelineBalance::Memory;
  RT_THROW(flag, ": '", text, "' is not one of time, memory");
}
OptimizerKind parse_optimizer(const std::string& t, const std::string& flag) { return parse_in(kOptimizers, t, flag); }
LrShape parse_lr_shape(const std::string& t, const std::string& flag) { return parse_in(kShapes, t, flag); }
LrScaling parse_lr_scaling(const std::string& t, const std::string& flag) { return parse_in(kScalings, t, flag); }
Precision parse_precision(const std::string& t, const std::string& flag) { return parse_in(kPrecisions, t, flag); }
DeviceChoice parse_device_choice(const std::string& t, const std::string& flag) { return parse_in(kDevices, t, flag); }
const char* on_off(bool v) { return name_in(kOnOff, v); }
bool parse_on_off(const std::string& t, const std::string& flag) { return parse_in(kOnOff, t, flag); }

CrossEntropyOptions loss_options(const TrainerOptions& o) {
  return {.label_smoothing = o.label_smoothing, .ignore_index = o.ignore_index, .weight = Tensor()};
}

const char* compression_name(comm::Compression c) {
  switch (c) {
    case comm::Compression::None:
      return "none";
    case comm::Compression::BF16:
      return "bf16";
    case comm::Compression::F16:
      return "fp16";
  }
  return "?";
}

std::optional<DType> autocast_type(Precision p) {
  if (p == Precision::FP32) return std::nullopt;
  return p == Precision::BF16 ? DType::BF16 : DType::F16;
}

json TrainerOptions::to_json() const {
  json j{{"model", model_name},
         {"batch_size", batch},
         {"epochs", epochs},
         {"steps", steps},
         {"accum_steps", accum},
         {"seed", seed},
         {"optimizer", name_of(optimizer)},
         {"lr", lr},
         {"momentum", momentum},
         {"wd", wd},
         {"nesterov", nesterov},
         {"warmup_epochs", warmup_epochs},
         {"lr_schedule", name_of(lr_schedule)},
         {"lr_step_epochs", lr_step_epochs},
         {"lr_milestones", lr_milestones},
         {"lr_gamma", lr_gamma},
         {"lr_scaling", name_of(lr_scaling)},
         {"label_smoothing", label_smoothing},
         {"device", name_of(device)},
         {"precision", name_of(precision)},
         {"tf32", on_off(tf32)},
         {"backend", backend ? comm::backend_name(*backend) : "auto"},
         {"bucket_mb", bucket_mb},
         {"compression", compression_name(compression)},
         {"sync_bn", sync_bn},
         {"clip_grad_norm", clip_grad_norm}};
  // How the model is spread over the ranks and what it keeps, not what it computes: recorded, and
  // changeable on resume.
  if (recompute) j["recompute"] = true;
  if (cuda_graph) j["cuda_graph"] = true;
  if (layout_auto) j["layout"] = "auto";
  if (pipeline_stages > 1)
    j["pipeline"] = {{"stages", pipeline_stages},
                     {"split", pipeline_split},
                     {"schedule", name_of(pipeline_schedule)},
                     {"balance", name_of(pipeline_balance)},
                     {"recompute", pipeline_recompute}};
  for (const auto& [key, value] : app_config.items()) j[key] = value;
  if (!flags.empty()) j["flags"] = flags;
  return j;
}

std::vector<std::pair<std::string, std::string>> output_files(const TrainerOptions& o) {
  std::vector<std::pair<std::string, std::string>> files = {{"--log-jsonl", o.log_jsonl}, {"--trace", o.trace}};
  files.insert(files.end(), o.written_files.begin(), o.written_files.end());
  return files;
}

void check_outputs(const TrainerOptions& o) {
  io::RunFiles files;
  files.reads("--resume", o.resume == "auto" ? "" : o.resume).reads("--link-calibration", o.link_calibration);
  for (const auto& [flag, path] : o.read_folders) files.reads_folder(flag, path);
  for (const auto& [flag, path] : output_files(o)) files.writes(flag, path);
  files.writes_folder("--checkpoint-dir", o.checkpoint_dir);
  files.check();
}

void validate_options(const TrainerOptions& o) {
  auto finite = [](double v) { return std::isfinite(v); };
  RT_CHECK(o.batch >= 0, "--batch-size must be at least 1 (or auto), got ", o.batch);
  RT_CHECK(o.global_batch >= 0, "--global-batch must be 0 (off) or more, got ", o.global_batch);
  RT_CHECK(std::isfinite(o.wait_for_gpu) && o.wait_for_gpu >= 0,
           "--wait-for-gpu must be 0 (no wait) or more minutes, got ", o.wait_for_gpu);
  if (!o.gpus.empty()) parse_gpu_list(o.gpus);
  RT_CHECK(o.max_memory >= 0, "--max-memory must be 0 (the free memory) or more, got ", o.max_memory);
  RT_CHECK(o.batch > 0 || o.pipeline_stages == 1,
           "-b auto needs one pipeline stage (the memory plan of --pipeline-stages is not predicted): give -b");
  RT_CHECK(o.global_batch == 0 || o.accum == 1, "--global-batch chooses --accum-steps: give one of the two, not both");
  RT_CHECK(o.epochs >= 1, "--epochs must be at least 1, got ", o.epochs);
  RT_CHECK(o.steps >= 0, "--steps must be 0 (off) or more, got ", o.steps);
  RT_CHECK(o.accum >= 1, "--accum-steps must be at least 1, got ", o.accum);
  RT_CHECK(finite(o.lr) && o.lr > 0, "--lr must be a positive number, got ", o.lr);
  RT_CHECK(finite(o.momentum) && o.momentum >= 0 && o.momentum <= 1, "--momentum must be in [0, 1], got ", o.momentum);
  RT_CHECK(finite(o.wd) && o.wd >= 0, "--wd must be 0 or more, got ", o.wd);
  RT_CHECK(finite(o.warmup_epochs) && o.warmup_epochs >= 0, "--warmup-epochs must be 0 or more, got ", o.warmup_epochs);
  RT_CHECK(finite(o.lr_step_epochs) && o.lr_step_epochs > 0, "--lr-step-epochs must be positive, got ",
           o.lr_step_epochs);
  RT_CHECK(finite(o.lr_gamma) && o.lr_gamma > 0, "--lr-gamma must be positive, got ", o.lr_gamma);
  RT_CHECK(finite(o.label_smoothing) && o.label_smoothing >= 0 && o.label_smoothing < 1,
           "--label-smoothing must be in [0, 1), got ", o.label_smoothing);
  RT_CHECK(o.threads >= 0 && o.loader_threads >= 0,
           "--threads and --loader-threads must be 0 (automatic) or more, got ", o.threads, " and ", o.loader_threads);
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
  RT_CHECK(o.checkpoint_every == 0 || !o.checkpoint_dir.empty(), "--checkpoint-every ", o.checkpoint_every,
           " needs --checkpoint-dir (where to write them)");
  RT_CHECK(o.keep_last == 0 || !o.checkpoint_dir.empty(), "--keep-last needs --checkpoint-dir");
  RT_CHECK(o.zero == 0 || o.zero == 1, "--zero must be 0 or 1, got ", o.zero);
  RT_CHECK(o.zero == 0 || o.compression == comm::Compression::None, "--zero 1 does not combine with --compression");
  RT_CHECK(finite(o.clip_grad_norm) && o.clip_grad_norm >= 0,
           "--clip-grad-norm must be 0 (off) or a positive norm, got ", o.clip_grad_norm);
  RT_CHECK(!o.start_over || !o.checkpoint_dir.empty(),
           "--start-over needs --checkpoint-dir (the folder to start over in)");
  RT_CHECK(!o.start_over || o.resume != "auto",
           "--start-over does not combine with --resume auto: continue the folder's run with --resume auto, or start "
           "a new one with --start-over");
  RT_CHECK(o.lr_milestones.empty() || o.lr_schedule == LrShape::MultiStep, "--lr-milestones ", o.lr_milestones,
           " applies to --lr-schedule multistep only, but the schedule is ", name_of(o.lr_schedule));
  // A flag without effect in the chosen mode is refused naming the mode, as --lr-milestones is (a flag whose
  // default is a value, such as --momentum 0.9, only where it was given).
  RT_CHECK(!o.given.contains("--lr-gamma") || o.lr_schedule != LrShape::Cosine, "--lr-gamma ", o.lr_gamma,
           " applies to --lr-schedule step or multistep, but the schedule is cosine");
  RT_CHECK(!o.given.contains("--lr-step-epochs") || o.lr_schedule == LrShape::Step, "--lr-step-epochs ",
           o.lr_step_epochs, " applies to --lr-schedule step only, but the schedule is ", name_of(o.lr_schedule));
  if (o.optimizer == OptimizerKind::AdamW) {
    RT_CHECK(!o.given.contains("--momentum"), "--momentum ", o.momentum,
             " applies to --optimizer sgd only, but the optimizer is adamw (its moments have fixed betas 0.9 and "
             "0.999)");
    RT_CHECK(!o.nesterov, "--nesterov applies to --optimizer sgd only, but the optimizer is adamw");
  }
  RT_CHECK(!o.nesterov || o.momentum > 0, "--nesterov needs a --momentum above 0, got ", o.momentum,
           " (as PyTorch's SGD: Nesterov momentum requires a momentum)");
  RT_CHECK(o.pipeline_stages >= 1, "--pipeline-stages must be at least 1, got ", o.pipeline_stages);
  RT_CHECK(o.pipeline_split.empty() || o.pipeline_stages > 1, "--pipeline-split ", o.pipeline_split,
           " needs --pipeline-stages 2 or more");
  RT_CHECK(!o.pipeline_recompute || o.pipeline_stages > 1, "--pipeline-recompute needs --pipeline-stages 2 or more");
  RT_CHECK(!o.recompute || !o.pipeline_recompute,
           "--recompute and --pipeline-recompute: choose one (--pipeline-recompute keeps only each stage's input, "
           "--recompute each block's)");
  RT_CHECK(o.checkpoint_every_min == 0 || !o.checkpoint_dir.empty(), "--checkpoint-every-min ", o.checkpoint_every_min,
           " needs --checkpoint-dir (where to write them)");
  // Every option takes effect in every mode it is given in, or is refused there naming the mode.
  RT_CHECK(!o.start_over || o.resume.empty(), "--start-over does not combine with --resume ", o.resume,
           ": --resume continues a run, --start-over sets the folder's runs aside to begin a new one; choose one");
  RT_CHECK(o.max_memory == 0 || o.pipeline_stages == 1, "--max-memory ", format_bytes(o.max_memory),
           " does not apply with --pipeline-stages ", o.pipeline_stages,
           ": the memory plan predicts one-stage runs only (--pipeline-balance memory balances the stages' memory)");
  // --layout auto decides these; given by hand too, one of the two would be ignored.
  if (o.layout_auto)
    for (const auto& [given, flag] :
         {std::pair{o.pipeline_stages != 1 || o.given.contains("--pipeline-stages"), "--pipeline-stages"},
          std::pair{!o.pipeline_split.empty(), "--pipeline-split"},
          std::pair{o.zero != 0 || o.given.contains("--zero"), "--zero"},  // --zero 0 too: it ran ZeRO-1
          std::pair{o.recompute, "--recompute"}, std::pair{o.pipeline_recompute, "--pipeline-recompute"}})
      RT_CHECK(!given, "--layout auto chooses ", flag, " itself: drop ", flag, ", or give the whole layout by hand ",
               "without --layout auto");
  RT_CHECK(o.link_calibration.empty() || o.layout_auto, "--link-calibration ", o.link_calibration,
           " is read by --layout auto only");
  // --cuda-graph: what a captured step cannot do. The f16 scaler and clipping read the gradients on the host
  // each step; ZeRO-1, SyncBatchNorm, compression and stages communicate inside the step.
  if (o.cuda_graph) {
    RT_CHECK(o.device != DeviceChoice::Cpu,
             "--cuda-graph captures the step on a GPU, but --device cpu trains on the CPU: drop --cuda-graph");
    RT_CHECK(o.profile_steps == 0,
             "--profile times each op, and --cuda-graph replays the step as one launch: choose one");
    for (const auto& [given, flag] :
         {std::pair{o.precision == Precision::FP16, "--precision fp16 (its loss scaler reads the gradients each step)"},
          std::pair{o.clip_grad_norm > 0, "--clip-grad-norm (it reads the gradients' norm each step)"},
          std::pair{o.zero != 0, "--zero"}, std::pair{o.sync_bn, "--sync-bn"},
          std::pair{o.compression != comm::Compression::None, "--compression"},
          std::pair{o.pipeline_stages != 1, "--pipeline-stages"}})
      RT_CHECK(!given, "--cuda-graph does not combine with ", flag, ": drop one of them");
  }
  if (o.device == DeviceChoice::Cpu)
    for (const auto& [given, flag] :
         {std::pair{!o.gpus.empty(), "--gpus"}, std::pair{o.allow_shared_gpu, "--allow-shared-gpu"},
          std::pair{o.wait_for_gpu > 0, "--wait-for-gpu"}})
      RT_CHECK(!given, flag, " chooses GPUs, but --device cpu trains on the CPU: drop ", flag, " or use --device auto");
  check_outputs(o);
}

json rank_agreement(const TrainerOptions& o) {
  nlohmann::json j = o.to_json();
  j.erase("flags");  // the typed options above are what must agree (a rank's --threads may differ)
  j["log_every"] = o.log_every;
  j["eval_every"] = o.eval_every;
  j["checkpoint_every"] = o.checkpoint_every;
  j["checkpoint_every_min"] = o.checkpoint_every_min;
  j["zero"] = o.zero;  // the collectives of a step differ
  j["pipeline_stages"] = o.pipeline_stages;
  j["pipeline_split"] = o.pipeline_split;
  j["pipeline_schedule"] = name_of(o.pipeline_schedule);
  j["pipeline_balance"] = name_of(o.pipeline_balance);
  j["pipeline_recompute"] = o.pipeline_recompute;
  j["layout_auto"] = o.layout_auto;
  j["trace_steps"] = o.trace_steps;
  j["check"] = o.check;
  j["timeout"] = o.timeout;  // a watchdog of its own on some ranks but not others makes a collective differ
  for (const auto& [key, path] : {std::pair{"checkpoint_dir", &o.checkpoint_dir}, std::pair{"log_jsonl", &o.log_jsonl},
                                  std::pair{"trace", &o.trace}})
    j[key] = path->empty() ? "(unset)" : "(set)";
  return j;
}

}  // namespace ringtrain::runtime
