// runtime/config/options.h: TrainerOptions, every choice a training run is made of, with the names the flags and
// the checkpoints use for its enums. Checking them (validate_options) and the part every rank must agree
// on (rank_agreement) are pure functions of the options: no MPI, no files.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/grad_sync.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "optim/optimizer.h"

namespace ringtrain::runtime {

enum class OptimizerKind : uint8_t { Sgd, AdamW };
enum class LrScaling : uint8_t { None, Linear };  // Linear: lr x global batch / 256
enum class Precision : uint8_t { FP32, BF16, FP16 };
enum class DeviceChoice : uint8_t { Auto, Cpu, Cuda };
enum class ProgressStyle : uint8_t { Auto, Bar, Lines };    // runtime/telemetry/progress.h
enum class PipelineSchedule : uint8_t { OneFOneB, GPipe };  // runtime/pipeline/pipeline_plan.h
enum class PipelineBalance : uint8_t { Time, Memory };

// --profile: the warm-up steps before its window, and the steps it measures unless --profile-steps says.
constexpr int64_t kProfileWarmupSteps = 3;
// --cuda-graph: steps run op by op before the capture (cuDNN's algorithm search and the optimizer's state
// made by the first, a steady step to be sure).
constexpr int64_t kGraphWarmupSteps = 2;
constexpr int64_t kProfileDefaultSteps = 5;

// The names the flags and checkpoints use ("sgd", "cosine", "bf16", ...); parse errors name `flag`.
const char* name_of(OptimizerKind v);
const char* name_of(LrShape v);
const char* name_of(LrScaling v);
const char* name_of(Precision v);
const char* name_of(DeviceChoice v);
const char* name_of(ProgressStyle v);
const char* name_of(PipelineSchedule s);                // "1f1b" | "gpipe"
const char* name_of(PipelineBalance b);                 // "time" | "memory"
ProgressStyle parse_progress(const std::string& text);  // "auto" | "bar" | "lines"
PipelineSchedule parse_pipeline_schedule(const std::string& text, const std::string& flag = "--pipeline-schedule");
PipelineBalance parse_pipeline_balance(const std::string& text, const std::string& flag = "--pipeline-balance");
OptimizerKind parse_optimizer(const std::string& text, const std::string& flag = "--optimizer");
LrShape parse_lr_shape(const std::string& text, const std::string& flag = "--lr-schedule");
LrScaling parse_lr_scaling(const std::string& text, const std::string& flag = "--lr-scaling");
Precision parse_precision(const std::string& text, const std::string& flag = "--precision");
DeviceChoice parse_device_choice(const std::string& text, const std::string& flag = "--device");
// "on" | "off", as --tf32 spells a switch that is on unless turned off.
const char* on_off(bool v);
bool parse_on_off(const std::string& text, const std::string& flag);
// The autocast type of a precision: none for FP32, else BF16 or F16.
std::optional<DType> autocast_type(Precision p);

struct TrainerOptions {
  // ---- length and batch
  int64_t batch = 128;       // images per rank per micro-batch; global batch = batch x ranks x accum; 0: -b auto
  int64_t global_batch = 0;  // > 0: accum (and with -b auto the batch) chosen to make this the global batch
  int64_t epochs = 1;
  int64_t steps = 0;  // > 0: stop after this many optimizer steps (overrides epochs)
  int64_t accum = 1;  // micro-batches per optimizer step (all but the last under no_sync)
  uint64_t seed = 0;  // init, shuffling, augmentation
  // ---- optimisation
  OptimizerKind optimizer = OptimizerKind::Sgd;
  double lr = 0.1, momentum = 0.9, wd = 5e-4;
  bool nesterov = false;
  double warmup_epochs = 0;
  LrShape lr_schedule = LrShape::Cosine;
  double lr_step_epochs = 30;  // Step: decay every this many epochs
  std::string lr_milestones;   // MultiStep: epochs, comma-separated (empty: 50% and 75% of the run)
  double lr_gamma = 0.1;
  LrScaling lr_scaling = LrScaling::None;
  double label_smoothing = 0;  // of the default loss
  // The default loss's ignore index: labels equal to it count for nothing. fit() sets it from segmentation data
  // (DataInfo::ignore_index) when it is not set.
  std::optional<int64_t> ignore_index = std::nullopt;
  double clip_grad_norm = 0;  // > 0: gradients scaled to this global L2 norm when above it
  // ---- device and precision
  DeviceChoice device = DeviceChoice::Auto;  // Auto: cuda when a GPU is usable
  Precision precision = Precision::FP32;     // BF16/FP16 autocast convolutions and GEMMs; FP16 adds loss scaling
  // f32 convolutions and GEMMs on the GPU may use TF32 tensor cores (core/ops.h set_allow_tf32; inputs
  // rounded to 10-bit mantissas, f32 accumulation); on by default, as PyTorch's convolutions. No effect on
  // the CPU. A checkpoint written before the flag existed counts as on.
  bool tf32 = true;
  // The steady training step (every micro-batch's forward and backward, the optimizer, zeroing the
  // gradients) captured once as a CUDA graph after kGraphWarmupSteps steps run op by op, then replayed: one
  // launch a step instead of one per kernel (runtime/loop/trainer.cpp). One rank on a GPU; the same bits as
  // the op-by-op steps. A capture that fails says why and the run goes on op by op (as one whose step draws
  // dropout masks on the host does). A step function (StepFn) runs once, at the capture.
  bool cuda_graph = false;
  // The memory a rank may use (runtime/memory/memory_plan.h): a run predicted over it is refused before its first
  // step. 0: the device's free memory shared by the ranks on it (runtime/memory/memory_budget.h).
  int64_t max_memory = 0;
  bool recompute = false;  // activation recompute: every block's forward runs again in backward (layers/recompute.h)
  int threads = 0;         // CPU threads per rank (0: cores / local ranks)
  int loader_threads = 0;  // 0: automatic
  int loader_nice = 10;    // loader threads run this much lower in priority (0..19; data::LoaderOptions::nice)
  bool allow_shared_gpu = false;  // a GPU another job uses (or more ranks than GPUs) when no free one is left
  std::string gpus;               // --gpus "0,2": the CUDA indices this job may take (empty: any visible)
  double wait_for_gpu = 0;        // minutes to wait for a free GPU before the error naming who holds them
  // ---- data parallelism
  std::optional<comm::Backend> backend;  // nullopt: nccl on a GPU, ring on the CPU
  double bucket_mb = 25;
  comm::Compression compression = comm::Compression::None;
  bool sync_bn = false;
  int zero = 0;  // ZeRO stage: 1 shards the optimizer state across ranks (comm/zero.h)
  // ---- pipeline parallelism (runtime/pipeline/pipeline.h): the world is stages x replicas; accum is the micro-batches
  int pipeline_stages = 1;
  std::string pipeline_split;  // "0,9,18": each stage's first block (empty: balanced on measured costs)
  PipelineSchedule pipeline_schedule = PipelineSchedule::OneFOneB;
  PipelineBalance pipeline_balance = PipelineBalance::Time;
  bool pipeline_recompute = false;  // stages keep only their inputs and recompute the forward in backward
  // ---- the layout (runtime/layout/layout_probe.h): --layout auto chooses replicas x stages, the micro-batch
  // and accumulation, ZeRO-1, recompute, the backend and the bucket size for the global batch, measured first
  bool layout_auto = false;
  std::string link_calibration;  // a link model file (ringtrain_plan --save-link) instead of measuring it
  // ---- outputs and cadence
  std::string checkpoint_dir;       // empty: no checkpoints
  int64_t checkpoint_every = 0;     // optimizer steps between checkpoints (0: end of every epoch)
  double checkpoint_every_min = 0;  // also one when this many minutes passed since the last (rank 0's clock)
  int64_t keep_last = 0;            // checkpoints kept (0: all)
  std::string resume;               // "auto" (newest valid in checkpoint_dir, if any) or a checkpoint path
  bool allow_batch_change = false;  // resume a checkpoint of another global batch (another training, said)
  bool start_over = false;          // a new run in a folder of another run's checkpoints: they are moved aside first
  bool strict = false;              // data: a record that decodes only with libjpeg's warnings is an error, not counted
  int64_t eval_every = 1;           // epochs between evaluations of the test split
  int64_t log_every = 50;           // steps between progress lines / train records
  std::string log_jsonl, trace;
  // What else the run reads and writes, by flag, for check_outputs: the folders of its data (--data) and the
  // app's own outputs (ringtrain_plan's --save-link).
  std::vector<std::pair<std::string, std::string>> read_folders, written_files;
  int64_t trace_steps = 100;
  bool profile_layers = false;  // --profile-layers: the table per (layer, family) too
  int64_t profile_steps = 0;  // > 0: --profile's steady steps (runtime/telemetry/profiler.h), after kProfileWarmupSteps
  ProgressStyle progress = ProgressStyle::Auto;
  double timeout = 1800;  // seconds a phase may take before the job is aborted (0: off)
  bool check = false;     // run the preflight first
  // ---- what the run reports as itself
  std::string model_name = "model";                      // the plan record's "arch" and the startup line
  std::string program = "ringtrain";                     // the startup line's first word
  nlohmann::json app_config = nlohmann::json::object();  // more flags for the checkpoints' "config"
  // Every flag of the command line as parsed (runtime/config/cli.h flag_values; empty for a run configured in code):
  // the checkpoints' "config" keeps it under "flags", and a resume compares it flag by flag.
  nlohmann::json flags = nlohmann::json::object();
  // The flags given on the command line, by their long names ("--momentum"): a flag whose value is also its
  // default is refused where the run's mode gives it no effect only when it was given (empty in code).
  std::set<std::string> given;

  // The flags as the checkpoints' "config" records them (app_config merged in).
  nlohmann::json to_json() const;
};

// The option errors a run refuses before any work (ringtrain::Error naming the flag): out-of-range
// numbers, and flags that need another (--resume auto without --checkpoint-dir, ...).
void validate_options(const TrainerOptions& o);
// Part of validate_options: no output (--log-jsonl, --trace, written_files, --checkpoint-dir) lands on
// anything the run reads (--resume's checkpoint, --link-calibration, the read_folders) or on another output,
// through a link or not (io::RunFiles); the run checks the checkpoint folder's own names at start-up
// (CheckpointDir::output_problem) and that no output is a checkpoint, a shard or a foreign file it would
// corrupt (io::clobber_problem).
void check_outputs(const TrainerOptions& o);
// The files a run writes, each with its flag: --log-jsonl, --trace and the app's written_files (empty paths
// included: not written). check_outputs and the Trainer's start-up checks read this one list.
std::vector<std::pair<std::string, std::string>> output_files(const TrainerOptions& o);

// What every rank must agree on: the flags the checkpoints record, and whatever decides which collectives
// a rank takes part in (cadences, and whether checkpoints, the log and the trace are on).
nlohmann::json rank_agreement(const TrainerOptions& o);

// The default loss (cross-entropy over the model's logits) of a run with these options.
CrossEntropyOptions loss_options(const TrainerOptions& o);

// "none" | "bf16" | "fp16", as --compression spells it.
const char* compression_name(comm::Compression c);

}  // namespace ringtrain::runtime
