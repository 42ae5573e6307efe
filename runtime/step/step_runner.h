// runtime/step/step_runner.h: one optimizer step, however it runs. The loop (runtime/loop/trainer.cpp) makes one
// call per step, StepRunner::run(); what differs between the modes is how the step's micro-batches run, each
// mode in a file of its own:
//   op by op         runtime/step/op_by_op_step.h    every micro-batch's forward and backward, kernel by kernel
//   CUDA graph       runtime/step/graph_step.h       (--cuda-graph) the whole step captured once, then replayed
//   pipelined        runtime/pipeline/pipelined_step.h  (--pipeline-stages) this stage's share of the schedule
// What they share is here: the gradients finished across ranks, the optimizer, the GPU's pace, the injected
// faults, the ranks' check-in, the step's timings, trace spans and profile, and its losses (read on the host
// at once on the CPU; on the GPU kept on the device until the loop asks, runtime/step/loss_log.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/world.h"
#include "core/device.h"
#include "core/ops.h"
#include "runtime/cluster/fault_injection.h"
#include "runtime/cluster/watchdog.h"
#include "runtime/config/data_source.h"
#include "runtime/config/options.h"
#include "runtime/config/plan.h"
#include "runtime/step/loss_log.h"
#include "runtime/step/replica.h"
#include "runtime/telemetry/profiler.h"
#include "runtime/telemetry/step_timer.h"
#include "runtime/telemetry/trace.h"

namespace ringtrain::runtime {

// What a step runs with, fixed for the run (the references are the loop's, alive for the runner's life).
struct StepContext {
  comm::World& world;
  const TrainerOptions& options;
  Device device;
  Watchdog& watchdog;
  const RunPlan& plan;
  const LrSchedule& lr;
  const FaultInjection& inject;
  DataSource& data;
  Replica& replica;
  int replica_index = 0;  // this rank's data-parallel replica (its place in the step's global batch)
  StepTimer& timer;
  Trace& trace;
  int64_t first_step = 0;  // the run's (a resumed run's is its checkpoint's)
  // Each micro-batch's loss on the host, in order (the loop's report; it throws for a non-finite one).
  std::function<void(const LossLog::Origin&, double)> take_loss;
  // A record of the step's own into the run's JSONL log (rank 0: the profile, the CUDA graph's fate).
  std::function<void(const nlohmann::json&)> write_record;
};

class StepRunner {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StepRunner(StepContext context);
  virtual ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // How a step ended.
  struct End {
    bool ran = false;                 // no: the epoch's batches ran out first (nothing of the step ran)
    bool checkpoint_asked = false;    // rank 0 asked for a checkpoint now (--checkpoint-every-min, via the check-in)
    bool took = true;                 // no: an f16 step skipped for non-finite gradients
    std::optional<double> grad_norm;  // with --clip-grad-norm: the gradient norm before clipping
  };
  // The step after `step` steps done, from the epoch's micro-batch `micro` (advanced past those taken):
  // its micro-batches, the gradients across ranks, the optimizer, the check-in. `since_checkpoint_s`: the
  // time since the last checkpoint (rank 0's clock decides --checkpoint-every-min). Collective.
  End run(int64_t epoch, int64_t step, int64_t& micro, double since_checkpoint_s);

  // Reads the losses kept on the device into take_loss (at reports, checkpoints and epoch ends).
  void read_losses();
  // The run's end: says when the run ended before --profile's window did.
  void finish() const;

  // The message of a non-finite loss, where it was.
  static std::string non_finite_loss(double loss, int64_t epoch, int64_t step, int64_t micro);

 protected:
  // What a mode's micro-batches did.
  struct Micro {
    bool ran = false;    // no: the epoch's batches ran out first
    bool whole = false;  // the gradients' all-reduce and the optimizer ran too (a replayed graph)
    Clock::time_point begin, backward_start, backward_end;  // the step's start; the last micro-batch's backward
  };
  virtual Micro micro_batches(int64_t epoch, int64_t step, int64_t& micro) = 0;
  // The step's whole time (a pipeline's bubble needs it).
  virtual void ended(double step_s) { (void)step_s; }

  // drop_path's keying of the step's k-th micro-batch (core/ops.h sample_draws): its samples' place in the
  // step's global batch (the sampler deals each micro-batch to the replicas in order) and the generator's
  // stream where its forward begins. Whatever the split over ranks and micro-batches, a sample draws the same.
  SampleDraws micro_draws(int64_t step, int64_t k) const;
  // A micro-batch's loss, kept on the device or read now (a non-finite one throws from take_loss).
  void add_loss(const Tensor& loss, const LossLog::Origin& at);

  const StepContext context_;

 private:
  double pace_to_device(int64_t step);

  LossLog losses_;
  StepProfiler profiler_;  // --profile
  // On CUDA every step ends on a device event, and the host waits for the previous step's before it ends
  // the current one: never more than one step ahead of the GPU, so the steps' host times keep the GPU's
  // pace. Op by op the launch queue held the host back already; a replayed graph is one launch a step and
  // would otherwise never wait, its median step then the host's launch time.
  struct Fence {
    Event ends[2];
    int64_t recorded = 0;
  };
  std::unique_ptr<Fence> fence_;
};

}  // namespace ringtrain::runtime
