// runtime/pipeline/pipeline.h: pipeline stages x data-parallel replicas (--pipeline-stages S), for models that do
// not fit one device. The model (Module::blocks(): a ResNet's stem, residual blocks and head; a
// Sequential's children) is cut into S consecutive stages; each rank runs one stage of one replica
// (runtime/pipeline/pipeline_plan.h's StageGrid) and keeps only its stage's weights (the others' are released). The
// micro-batches of one optimizer step are the run's --accum-steps micro-batches, so the global batch and the
// data order are those of the run without stages: the first stage reads the images, the last the labels
// (and computes the loss), activations go forward and their gradients back by point-to-point messages of
// fixed shapes (comm/p2p.h: one channel per direction, so 1F1B's sends and receives cannot deadlock), in
// the schedule's order (1F1B or GPipe). Each stage's gradients are averaged over its replicas by the
// stage's Replica (GradSync over the stage's ranks); the clipping norm and the f16 scaler's finite check
// combine over the stages, so every stage takes the same decision. On the CPU one step equals one
// process's bit for bit: the same ops on the same micro-batches, gradients accumulated in micro-batch order.
//
// The split is --pipeline-split, or rank 0 profiles every block once (forward + backward seconds, the
// activation bytes its forward keeps, its parameter bytes; buffers and the generator restored after) and
// balances the stages by time or by memory (--pipeline-balance).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/p2p.h"
#include "comm/world.h"
#include "core/ops.h"
#include "data/loader.h"
#include "layers/module.h"
#include "optim/clip.h"
#include "runtime/cluster/fault_injection.h"
#include "runtime/cluster/watchdog.h"
#include "runtime/config/data_source.h"
#include "runtime/config/options.h"
#include "runtime/pipeline/pipeline_plan.h"
#include "runtime/step/evaluate.h"
#include "runtime/step/replica.h"
#include "runtime/telemetry/run_log.h"
#include "runtime/telemetry/trace.h"

namespace ringtrain::runtime {

class Pipeline {
 public:
  using Named = std::vector<std::pair<std::string, Tensor>>;
  using Clock = std::chrono::steady_clock;

  // Collective over the world. The model holds its starting weights (fresh or resumed) on every rank;
  // afterwards only this stage's. Errors (permanent) name the flag or the model: a model that is no
  // sequence of blocks, fewer blocks than stages, a bad --pipeline-split, a custom step function.
  // `inject`: the run's RINGTRAIN_INJECT, whose "stop" lands after a micro-batch's forward.
  Pipeline(comm::World& world, const TrainerOptions& o, Device device, Module& model, const DataInfo& info,
           Watchdog& dog, const FaultInjection& inject);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  const StageGrid& grid() const { return grid_; }
  // Whether this rank reads data: the first stage (images) and the last (labels).
  bool reads_data() const { return grid_.first() || grid_.last(); }
  // What the stage's Replica holds: its ranks, its blocks' parameters and buffers, the other stages.
  ReplicaScope scope() const;
  // The plan record's "pipeline" (stages x replicas, schedule, split, per-stage costs) and the startup line's part.
  nlohmann::json plan() const;
  std::string describe() const;

  // One optimizer step's micro-batches, this stage's share of them in the schedule's order. `next_batch`
  // gives this rank's next micro-batch (first stage: images; last: labels). `on_loss` sees each micro-batch's
  // loss on the last stage (and may throw: a non-finite loss). Collective over the replica's stages.
  struct StepWork {
    double busy_s = 0;       // this stage's compute
    double data_wait_s = 0;  // waiting for next_batch
    double forward_s = 0, backward_s = 0;
    double recompute_s = 0;  // --pipeline-recompute: the forwards run again (part of backward_s)
    double wait_s = 0;       // waiting for the neighbours' activations and gradients
    int64_t held_bytes = 0;  // the most memory the step's micro-batches held at once (their activations)
    Clock::time_point backward_start, backward_end;  // of the last micro-batch
  };
  StepWork run_step(Replica& replica, int64_t step, const std::function<data::Batch()>& next_batch,
                    const std::function<void(int micro, double loss)>& on_loss, Trace& trace);

  // Collective: evaluation through the pipeline, every test image scored once (the first stage reads them,
  // the last the labels), the sums all-reduced over the world.
  // The options and their checks are evaluate()'s (runtime/step/evaluate.h), on_batch and on_wait called where
  // it calls them, on every stage; a custom `logits` (it would see the whole model) is refused. `step` names the
  // watchdog's phases, which say the stage and batch.
  EvalResult evaluate(data::Loader* loader, int64_t test_size, const EvalOptions& options, int64_t step);

  // Collective over the world: the whole model's state (every stage's parameters and buffers) and the
  // optimizer's canonical state, on world rank 0 (empty elsewhere). `optimizer` is this stage's.
  Named gather_model();
  Named gather_optimizer(const Named& optimizer);

  // Collective: every rank's `value`, per stage (replica 0's), on every rank.
  std::vector<double> per_stage(double value) const;
  // A step's whole time (from its first micro-batch to the end of its check-in), for the report's bubble.
  void end_step(double step_s) { interval_.step_s += step_s; }
  // Collective: per stage (the first replica's) since the last report: compute per step over the `steps`
  // steps, the share of the step it left idle, the most activation memory a step held, the ideal bubble.
  // Starts the next interval.
  nlohmann::json interval_report(int64_t steps);

  // Collective: the channels and communicators closed (the success path only).
  void close();

 private:
  struct Interval {
    double busy_s = 0, step_s = 0;  // this stage's compute and step time since the last report
    int64_t held_bytes = 0;         // the most activation memory a step of the interval held
  };
  Interval interval_;
  uint64_t combined_bucket_plan(uint64_t mine) const;  // collective (ReplicaScope::bucket_plan_of)
  struct Boundary {
    Shape shape;  // of one micro-batch
    DType dtype = DType::F32;
  };
  void decide_split(const TrainerOptions& o, const DataInfo& info);
  std::map<const TensorImpl*, int> owners() const;
  void keep_my_blocks();
  Tensor run_blocks(const Tensor& x) const;
  SampleDraws micro_draws(int64_t step, int m, uint64_t step_stream) const;
  void recomputed_backward(Replica& replica, const Tensor& input, uint64_t rng_at, const Tensor& labels,
                           const Tensor& grad, bool last_micro, StepWork& w, int64_t start_bytes);
  Shape with_batch(const Boundary& b, int64_t n) const;

  comm::World& world_;
  const TrainerOptions& o_;
  Device device_;
  Module& model_;
  Watchdog& dog_;
  const FaultInjection& inject_;
  StageGrid grid_;
  PipelineSchedule schedule_;
  bool recompute_ = false;             // --pipeline-recompute
  uint64_t draws_per_micro_ = 0;       // generator streams one micro-batch's forward takes (dropout), all blocks
  uint64_t draws_before_ = 0;          // ... in the blocks before this stage
  std::vector<Tensor> buffer_copies_;  // the stage's buffers, kept across a recomputed forward
  std::vector<Block> blocks_;
  PipelineSplit split_;
  std::vector<BlockCost> costs_;   // measured on rank 0 (empty with an explicit split)
  std::vector<Boundary> outputs_;  // each block's output, for one micro-batch
  Named params_, buffers_;         // this stage's
  MPI_Comm stage_comm_ = MPI_COMM_NULL, pipe_comm_ = MPI_COMM_NULL;
  std::unique_ptr<comm::Channel> forward_, backward_;
  std::unique_ptr<GradientParts> across_;
};

}  // namespace ringtrain::runtime
