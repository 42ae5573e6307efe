// runtime/loop/trainer.h: the training loop every model shares. A Trainer is built first — it binds this rank
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
// Before the first step it plans the run's memory (runtime/memory/memory_plan.h): -b auto, --max-memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/world.h"
#include "core/device.h"
#include "data/loader.h"
#include "layers/module.h"
#include "runtime/cluster/watchdog.h"
#include "runtime/config/data_source.h"
#include "runtime/config/options.h"
#include "runtime/layout/layout_probe.h"
#include "runtime/pipeline/pipeline_plan.h"
#include "runtime/types.h"

namespace ringtrain::runtime {

class FolderLock;
class GpuLock;

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
  // Where this rank sits with --pipeline-stages (one stage of one replica; without stages, the world's
  // rank of world-size replicas). With --layout auto, fit() decides it: data sources read their part from
  // the sampler fit() gives them, never from this.
  const StageGrid& grid() const { return grid_; }

  // Collective. Moves the model to device(), trains it on `data` and returns the figures rank 0 printed.
  // May be called again (another model or run) with the same Trainer; each call is a run of its own (a
  // fresh one refuses a --checkpoint-dir holding another run's checkpoints, as runtime/checkpoint/resume.h says).
  // The memory plan's probe calls `step_fn` twice first, on batches of random images (a fixed seed), and
  // puts the model back as it was (layers/model_state.h), also when it throws.
  TrainResult fit(Module& model, DataSource& data, const StepFn& step_fn = {});
  // Collective, ringtrain_plan's: what --layout auto would choose for the world `what_if` describes (the
  // world it runs in where that says nothing), printed by rank 0 with what it measured; trains nothing and
  // leaves the model as it was. Returns the plan (runtime/layout/layout_probe.h), also written to --log-jsonl
  // as a "layout_plan" record.
  nlohmann::json plan_layout(Module& model, DataSource& data, const LayoutWhatIf& what_if, const StepFn& step_fn = {});

 private:
  void agree_on_device();
  int choose_this_ranks_gpu();
  comm::World& world_;
  TrainerOptions options_;
  StageGrid grid_;
  Device device_ = Device::cpu();
  int threads_ = 1;
  std::unique_ptr<Watchdog> watchdog_;  // made once the ranks agree on the flags (its making is collective)
  std::unique_ptr<FolderLock> lock_;    // rank 0: --checkpoint-dir's lock, held while the Trainer lives
  // This rank's GPU's lock (runtime/cluster/gpu_choice.h), held while the Trainer lives.
  std::unique_ptr<GpuLock> gpu_lock_;
};

}  // namespace ringtrain::runtime
