// runtime/trainer.h: the training loop every model shares. A Trainer is built first — it binds this rank
// (device, CPU threads), seeds the default generator (so the model built next is initialised the same on
// every rank), starts the watchdog, runs the preflight when asked and proves the output paths writable —
// then fit() trains a model on a DataSource:
//
//   runtime::Trainer trainer(world, options);
//   auto data = runtime::open_shards(dir, {.device = trainer.device()});
//   MyNet net(data->info().channels, data->info().classes);
//   trainer.fit(net, *data);                        // or fit(net, *data, step_fn) for an unusual forward
//
// fit() owns what makes a run trustworthy: the optimizer and LR schedule, exact resume from a checkpoint
// (also at another world size with the same global batch), GradSync (rank 0's weights everywhere, gradient
// all-reduce overlapped with backward), accumulation under no_sync, autocast and f16 loss scaling, the
// per-step check-in, progress lines, the JSONL log, the trace, evaluation and checkpoint cadence, GPU
// telemetry and the summary. On the CPU a resumed run ends bitwise identical to an uninterrupted one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "comm/grad_sync.h"
#include "comm/world.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/optim/optimizer.h"
#include "data/loader.h"
#include "layers/module.h"
#include "runtime/data_source.h"
#include "runtime/progress.h"
#include "runtime/run_log.h"
#include "runtime/watchdog.h"

namespace ringtrain::runtime {

enum class OptimizerKind : uint8_t { Sgd, AdamW };
enum class LrScaling : uint8_t { None, Linear };  // Linear: lr x global batch / 256
enum class Precision : uint8_t { FP32, BF16, FP16 };
enum class DeviceChoice : uint8_t { Auto, Cpu, Cuda };

// The names the flags and checkpoints use ("sgd", "cosine", "bf16", ...); parse errors name `flag`.
const char* name_of(OptimizerKind v);
const char* name_of(LrShape v);
const char* name_of(LrScaling v);
const char* name_of(Precision v);
const char* name_of(DeviceChoice v);
const char* name_of(ProgressStyle v);
OptimizerKind parse_optimizer(const std::string& text, const std::string& flag = "--optimizer");
LrShape parse_lr_shape(const std::string& text, const std::string& flag = "--lr-schedule");
LrScaling parse_lr_scaling(const std::string& text, const std::string& flag = "--lr-scaling");
Precision parse_precision(const std::string& text, const std::string& flag = "--precision");
DeviceChoice parse_device_choice(const std::string& text, const std::string& flag = "--device");

struct TrainerOptions {
  // ---- length and batch
  int64_t batch = 128;   // images per rank per micro-batch; global batch = batch x ranks x accum
  int64_t epochs = 1;
  int64_t steps = 0;     // > 0: stop after this many optimizer steps (overrides epochs)
  int64_t accum = 1;     // micro-batches per optimizer step (all but the last under no_sync)
  uint64_t seed = 0;     // init, shuffling, augmentation
  // ---- optimisation
  OptimizerKind optimizer = OptimizerKind::Sgd;
  double lr = 0.1, momentum = 0.9, wd = 5e-4;
  bool nesterov = false;
  double warmup_epochs = 0;
  LrShape lr_schedule = LrShape::Cosine;
  double lr_step_epochs = 30;       // Step: decay every this many epochs
  std::string lr_milestones;        // MultiStep: epochs, comma-separated (empty: 50% and 75% of the run)
  double lr_gamma = 0.1;
  LrScaling lr_scaling = LrScaling::None;
  double label_smoothing = 0;       // of the default loss
  double clip_grad_norm = 0;        // > 0: gradients scaled to this global L2 norm when above it
  // ---- device and precision
  DeviceChoice device = DeviceChoice::Auto;  // Auto: cuda when a GPU is usable
  Precision precision = Precision::FP32;     // BF16/FP16 autocast convolutions and GEMMs; FP16 adds loss scaling
  int threads = 0;          // CPU threads per rank (0: cores / local ranks)
  int loader_threads = 0;   // 0: automatic
  int loader_nice = 10;     // loader threads run this much lower in priority (0..19; data::LoaderOptions::nice)
  bool allow_shared_gpu = false;
  // ---- data parallelism
  std::optional<comm::Backend> backend;  // nullopt: nccl on a GPU, ring on the CPU
  double bucket_mb = 25;
  comm::Compression compression = comm::Compression::None;
  bool sync_bn = false;
  int zero = 0;             // ZeRO stage: 1 shards the optimizer state across ranks (comm/zero.h)
  // ---- outputs and cadence
  std::string checkpoint_dir;   // empty: no checkpoints
  int64_t checkpoint_every = 0; // optimizer steps between checkpoints (0: end of every epoch)
  double checkpoint_every_min = 0;  // also one when this many minutes passed since the last (rank 0's clock)
  int64_t keep_last = 0;        // checkpoints kept (0: all)
  std::string resume;           // "auto" (newest valid in checkpoint_dir, if any) or a checkpoint path
  bool allow_batch_change = false;  // resume a checkpoint of another global batch (another training, said)
  int64_t eval_every = 1;       // epochs between evaluations of the test split
  int64_t log_every = 50;       // steps between progress lines / train records
  std::string log_jsonl, trace;
  int64_t trace_steps = 100;
  ProgressStyle progress = ProgressStyle::Auto;
  double timeout = 1800;        // seconds a phase may take before the job is aborted (0: off)
  bool check = false;           // run the preflight first
  // ---- what the run reports as itself
  std::string model_name = "model";              // the plan record's "arch" and the startup line
  std::string program = "ringtrain";             // the startup line's first word
  nlohmann::json app_config = nlohmann::json::object();  // more flags for the checkpoints' "config"

  // The flags as the checkpoints' "config" records them (app_config merged in).
  nlohmann::json to_json() const;
};

// A model's loss for one micro-batch (called under autocast). The default is cross-entropy (with
// label_smoothing) of model(images) against the labels.
using StepFn = std::function<Tensor(Module& model, const data::Batch& batch)>;

struct TrainResult {
  int64_t steps = 0;          // optimizer steps done at the end (including those before a resume)
  int64_t steps_run = 0;      // in this process
  double train_loss = 0;      // the last finite micro-batch loss of rank 0
  std::optional<EvalResult> eval;
  double img_per_s = 0, median_step_s = 0, elapsed_s = 0;
  int64_t skipped_steps = 0;  // f16 steps skipped for non-finite gradients
  std::string resumed_from;   // the checkpoint this run started from, if any
};

class Trainer {
 public:
  Trainer(comm::World& world, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  const comm::World& world() const { return world_; }
  Device device() const { return device_; }
  int threads() const { return threads_; }
  const TrainerOptions& options() const { return options_; }
  Watchdog& watchdog() { return *watchdog_; }

  // Collective. Moves the model to device(), trains it on `data` and returns the figures rank 0 printed.
  // May be called again (another model or run) with the same Trainer.
  TrainResult fit(Module& model, DataSource& data, const StepFn& step_fn = {});

 private:
  void agree_on_device();
  comm::World& world_;
  TrainerOptions options_;
  Device device_ = Device::cpu();
  int threads_ = 1;
  std::unique_ptr<Watchdog> watchdog_;  // made once the ranks agree on the flags (its making is collective)
};

}  // namespace ringtrain::runtime
