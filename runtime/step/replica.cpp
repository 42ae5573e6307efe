// runtime/step/replica.cpp: the communicators, GradSync, the optimizer and the loss scaler of this rank, and one
// micro-batch's forward and backward and one optimizer step over them.
#include "runtime/step/replica.h"

#include <cmath>
#include <cstdio>

#include "comm/mpi_check.h"
#include "comm/sync_batchnorm.h"
#include "comm/zero.h"
#include "core/autocast.h"
#include "core/check.h"
#include "core/cpu_features.h"
#include "core/ops.h"
#include "optim/clip.h"
#include "runtime/cluster/check_in.h"

namespace ringtrain::runtime {

namespace {

// The update rule over some parameters (with --zero 1: this rank's pieces of them).
std::unique_ptr<Optimizer> make_rule(const TrainerOptions& o, std::vector<NamedParameter> params) {
  if (o.optimizer == OptimizerKind::Sgd)
    return std::make_unique<Sgd>(std::move(params),
                                 SgdOptions{.momentum = o.momentum, .nesterov = o.nesterov, .weight_decay = o.wd});
  return std::make_unique<AdamW>(std::move(params), AdamWOptions{.weight_decay = o.wd});
}

// A result over the gradients held here combined over ZeRO's shards of them first, then over the holders
// of the other parameters (a pipeline's other stages).
class CombinedParts final : public GradientParts {
 public:
  CombinedParts(const GradientParts* shards, const GradientParts* across) : shards_(shards), across_(across) {}
  void max(std::span<uint64_t> values) const override {
    if (shards_) shards_->max(values);
    if (across_) across_->max(values);
  }
  void sum(std::span<uint64_t> values) const override {
    if (shards_) shards_->sum(values);
    if (across_) across_->sum(values);
  }

 private:
  const GradientParts* shards_;
  const GradientParts* across_;
};

}  // namespace

Replica::Replica(comm::World& world, const TrainerOptions& o, Device device, Module& model, StepFn step_fn,
                 const ReplicaStart& start, const ReplicaScope& scope)
    : world_(world),
      o_(o),
      model_(model),
      step_fn_(std::move(step_fn)),
      autocast_(autocast_type(o.precision)),
      loss_fn_(loss_options(o)),
      backend_(o.backend.value_or(comm::auto_backend(world, device))) {
  // --tf32: process-wide, like PyTorch's torch.backends.cudnn.allow_tf32; every forward, backward and
  // evaluation of the run from here computes under it (set again by each run, so no run inherits another's).
  set_allow_tf32(o_.tf32);
  if (world_.is_root() && autocast_ && device.is_cpu())
    std::printf("note: --precision %s on the CPU: %s\n", name_of(o_.precision), cpu_half_path(*autocast_).why.c_str());
  const MPI_Comm holders = scope.comm != MPI_COMM_NULL ? scope.comm : world_.comm();
  MPI_CHECK(MPI_Comm_size(holders, &holders_));
  comm_ = comm::make_communicator(backend_, holders);
  // SyncBatchNorm's all-reduces on a communicator of their own: they must not queue behind gradient buckets.
  if (o_.sync_bn) {
    bn_comm_ = comm::make_communicator(backend_, holders);
    comm::convert_sync_batchnorm(model_, bn_comm_);
  }
  if (world_.is_root() && o_.compression == comm::Compression::F16 && o_.precision != Precision::FP16)
    std::fprintf(stderr,
                 "%s: warning: --compression fp16 without --precision fp16 sends unscaled gradients as fp16, "
                 "where values below 6e-8 flush to zero and above 65504 overflow; bf16 keeps fp32's range\n",
                 o_.program.c_str());
  comm::GradSyncOptions gso;
  gso.bucket_mb = o_.bucket_mb;
  gso.compression = o_.compression;
  gso.zero_stage = o_.zero;
  // Rank 0's (possibly resumed) weights everywhere. A scope's own list has no per-layer hooks, so ZeRO-1's
  // all-gather is then waited for at once instead of overlapping the next forward.
  sync_ = scope.parameters ? std::make_unique<comm::GradSync>(*scope.parameters, *scope.buffers, comm_, gso)
                           : std::make_unique<comm::GradSync>(model_, comm_, gso);
  bucket_plan_ = bucket_plan_hash(sync_->buckets());
  if (scope.bucket_plan_of) bucket_plan_ = scope.bucket_plan_of(bucket_plan_);
  const auto named = scope.parameters ? *scope.parameters : model_.named_parameters();
  if (o_.zero == 1) {
    auto zero = std::make_unique<comm::ZeroOptimizer>(
        *sync_, [o](std::vector<NamedParameter> pieces) { return make_rule(o, std::move(pieces)); });
    zero_ = zero.get();
    opt_ = std::move(zero);
  } else {
    opt_ = make_rule(o_, as_named(named));
  }
  for (const auto& [name, tensor] : named) parameters_.push_back(tensor);
  if (zero_ || scope.across) parts_ = std::make_unique<CombinedParts>(zero_, scope.across);
  if (start.optimizer_state) {
    try {
      opt_->load_state(*start.optimizer_state);
    } catch (const std::exception& e) {
      RT_THROW_PERMANENT("--resume ", start.from, ": ", e.what());
    }
  }
  if (o_.precision == Precision::FP16) scaler_.emplace();
  if (scaler_ && start.loss_scale) scaler_->load(start.loss_scale->scale, start.loss_scale->growth_tracker);
}

Replica::~Replica() = default;

Tensor Replica::forward(const data::Batch& batch) {
  Tensor loss;
  {
    AutocastGuard autocast_scope(autocast_);
    loss = step_fn_ ? step_fn_(model_, batch) : loss_fn_(model_(batch.images), batch.labels);
  }
  if (!loss.defined() || loss.numel() != 1)
    RT_THROW_PERMANENT("the step function must return a scalar loss, got ",
                       loss.defined() ? loss.describe() : std::string("an undefined tensor"));
  return loss;
}

void Replica::backward(const Tensor& loss, bool last_micro) {
  Tensor objective = o_.accum > 1 ? mul(loss, 1.0 / static_cast<double>(o_.accum)) : loss;
  if (scaler_) objective = scaler_->scale_loss(objective);
  if (last_micro) {
    objective.backward();
    return;
  }
  auto guard = sync_->no_sync();
  objective.backward();
}

void Replica::backward_from(const Tensor& y, const Tensor& grad, bool last_micro) {
  if (last_micro) {
    y.backward(grad);
    return;
  }
  auto guard = sync_->no_sync();
  y.backward(grad);
}

Tensor Replica::loss_of(const Tensor& logits, const Tensor& labels) { return loss_fn_(logits, labels); }

void Replica::finish_gradients() { sync_->finish(); }

void Replica::zero_grad() { sync_->zero_grad(); }

StepOutcome Replica::step(double lr, int64_t step) {
  // The gradients are averaged already, so every rank takes the same decisions. With ZeRO-1 each rank holds
  // its shard of them: the finite check and the norm combine over the shards (one small all-reduce each).
  const std::vector<Tensor>& held = zero_ ? zero_->shard_parameters() : parameters_;
  const GradientParts* parts = parts_.get();
  StepOutcome out;
  out.took = !scaler_ || scaler_->unscale(held, parts);
  if (out.took && o_.clip_grad_norm > 0) {
    out.grad_norm = clip_grad_norm(held, o_.clip_grad_norm, parts);
    if (!std::isfinite(out.grad_norm))
      RT_THROW_PERMANENT("non-finite gradient norm (", out.grad_norm, ") at step ", step,
                         ": lower --lr, add --warmup-epochs, or check the data");
  }
  if (out.took) opt_->step(lr);
  if (scaler_) {
    scaler_->update(!out.took);
    if (!out.took && scaler_->scale() < 1e-4)
      RT_THROW_PERMANENT("f16 loss scale fell to ", scaler_->scale(), " at step ", step,
                         ": the gradients are not finite at any scale (diverged); lower --lr or use --precision bf16");
  }
  sync_->zero_grad();
  return out;
}

std::string Replica::replayable() const { return opt_->replayable(); }

void Replica::stage(double lr) { opt_->stage(lr); }

void Replica::apply_and_zero() {
  opt_->apply();
  sync_->zero_grad();
}

void Replica::discard_step() { sync_->discard_step(); }

int64_t Replica::optimizer_state_bytes() const { return opt_->state_bytes(); }

std::vector<std::pair<std::string, Tensor>> Replica::optimizer_state() const { return opt_->state(); }

void Replica::average_buffers() {
  if (!o_.sync_bn && holders_ > 1) sync_->average_buffers();
}

void Replica::wait_parameters() { sync_->wait_parameters(); }

void Replica::close() {
  sync_->wait_parameters();  // the model stays usable after the run
  sync_.reset();
  comm_->close();
  if (bn_comm_) {
    comm::revert_sync_batchnorm(model_);  // the model stays usable after the run, with local statistics
    bn_comm_->close();
  }
}

}  // namespace ringtrain::runtime
