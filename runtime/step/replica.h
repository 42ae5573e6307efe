// runtime/step/replica.h: this rank's replica of the model and what keeps it equal to the others'. Built once the
// model holds its starting weights (fresh or resumed), it makes the run's communicator (and SyncBatchNorm's),
// GradSync (rank 0's weights everywhere, buckets all-reduced during backward), the optimizer (with --zero 1
// over this rank's shard) with any resumed state, the f16 loss scaler and the autocast type. Then, for each
// micro-batch, forward() and backward(); for each optimizer step, finish_gradients() and step():
//
//   Tensor loss = replica.forward(batch);      // under autocast
//   replica.backward(loss, last_micro);        // loss / accum (x the f16 scale); no_sync but the last
//   replica.finish_gradients();                // waits for the all-reduce
//   StepOutcome s = replica.step(lr, step);    // unscale, clip, update (or skip), zero the gradients
//
// close() is the collective end, on the success path only (destructors never communicate).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/grad_sync.h"
#include "comm/world.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/config/options.h"
#include "runtime/types.h"

namespace ringtrain::comm {
class ZeroOptimizer;
}

namespace ringtrain::runtime {

// What a resumed run brings into the replica (the weights are in the model already).
struct ReplicaStart {
  const std::vector<std::pair<std::string, Tensor>>* optimizer_state = nullptr;
  std::optional<LossScaleState> loss_scale;
  std::string from;  // the checkpoint, for error messages
};

// Which ranks hold the same parameters, and which parameters (a pipeline stage's: its ranks across the
// replicas, its blocks' tensors). The default is the whole model on every rank of the world.
struct ReplicaScope {
  MPI_Comm comm = MPI_COMM_NULL;  // the ranks holding these parameters (null: the world's)
  const std::vector<std::pair<std::string, Tensor>>* parameters = nullptr;  // null: the model's
  const std::vector<std::pair<std::string, Tensor>>* buffers = nullptr;
  // The holders of the other parameters (other pipeline stages): the clipping norm and the f16 scaler's
  // finite check combine over them too, so every stage takes the same decision.
  const GradientParts* across = nullptr;
  // Collective, with pipeline stages: this rank's bucket plan fingerprint made into one that every rank of
  // a consistent job shares (each stage's buckets differ). Null: the rank's own.
  std::function<uint64_t(uint64_t)> bucket_plan_of;
};

struct StepOutcome {
  bool took = true;      // false: an f16 step skipped for non-finite gradients
  double grad_norm = 0;  // before clipping (with --clip-grad-norm)
};

class Replica {
 public:
  // Collective. Sets the process-wide TF32 switch to o.tf32 (core/ops.h set_allow_tf32).
  Replica(comm::World& world, const TrainerOptions& o, Device device, Module& model, StepFn step_fn,
          const ReplicaStart& start, const ReplicaScope& scope = {});
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // The micro-batch's loss under autocast: the step function's, or cross-entropy (with label smoothing)
  // of model(images). Errors: anything but a scalar (permanent).
  Tensor forward(const data::Batch& batch);
  // Backward of loss / accum (scaled for f16); gradients accumulate locally (no_sync) unless last_micro.
  void backward(const Tensor& loss, bool last_micro);
  // A pipeline stage's backward: from its output `y` with the gradient the next stage sent (scaled
  // already), under no_sync unless last_micro.
  void backward_from(const Tensor& y, const Tensor& grad, bool last_micro);
  // The loss of logits against labels (the default loss: cross-entropy with label smoothing); the caller
  // holds the autocast scope.
  Tensor loss_of(const Tensor& logits, const Tensor& labels);
  const std::optional<DType>& autocast() const { return autocast_; }
  // Collective: waits for the last gradient bucket; gradients then hold the average over ranks.
  void finish_gradients();
  // Zeroes the gradient buckets (what step() does after each update; the loop at each epoch's start, where
  // an epoch that ended inside an accumulation left gradients behind).
  void zero_grad();
  // The optimizer step at `lr` (`step`: steps done before it, for messages). Errors (permanent): a
  // non-finite gradient norm, an f16 loss scale that collapsed.
  StepOutcome step(double lr, int64_t step);

  // --cuda-graph (runtime/loop/trainer.cpp) splits step() in two: stage(lr) before the replay (the host's
  // part, and the rate written on the device: optim/optimizer.h), apply_and_zero() inside the captured
  // work (the update, reading it there, then zero_grad()). The scaler, clipping and ZeRO-1 are refused with
  // the flag (runtime/config/options.cpp), and ZeroOptimizer has no staged step.
  // replayable(): why the optimizer's update cannot be captured now ("" when it can).
  std::string replayable() const;
  void stage(double lr);
  void apply_and_zero();
  // After a capture that failed part way (none of its kernels ran): the step's progress forgotten.
  void discard_step();

  bool scaled() const { return scaler_.has_value(); }  // f16 loss scaling
  const std::optional<GradScaler>& scaler() const { return scaler_; }
  comm::Backend backend() const { return backend_; }
  const comm::GradSync& sync() const { return *sync_; }
  // The fingerprint of the gradient buckets (the scope's combined one) the step check-in compares.
  uint64_t bucket_plan() const { return bucket_plan_; }
  int64_t optimizer_state_bytes() const;
  // Collective with --zero 1 (the shards gathered to rank 0): the canonical optimizer state, complete on
  // rank 0 (and on every rank without ZeRO).
  std::vector<std::pair<std::string, Tensor>> optimizer_state() const;
  // BatchNorm running statistics averaged over ranks (when they are per rank: no --sync-bn, several ranks).
  void average_buffers();
  // ZeRO-1: the last step's all-gather, left to the next forward, waited for (before reading the weights).
  void wait_parameters();
  // Collective: the teardown (the model stays usable, with local BatchNorm statistics).
  void close();

 private:
  comm::World& world_;
  const TrainerOptions& o_;
  Module& model_;
  StepFn step_fn_;
  std::optional<DType> autocast_;
  CrossEntropyLoss loss_fn_;
  comm::Backend backend_;
  comm::CommunicatorPtr comm_, bn_comm_;
  std::unique_ptr<comm::GradSync> sync_;
  std::unique_ptr<Optimizer> opt_;
  comm::ZeroOptimizer* zero_ = nullptr;  // opt_ with --zero 1
  std::optional<GradScaler> scaler_;
  std::vector<Tensor> parameters_;
  uint64_t bucket_plan_ = 0;
  int holders_ = 1;                             // ranks of the scope's communicator
  std::unique_ptr<const GradientParts> parts_;  // ZeRO's shards and the scope's other holders, combined
};

}  // namespace ringtrain::runtime
