// layers/batchnorm.h: BatchNorm2d over NHWC activations (statistics per channel, the last dim).
// Parameters and running statistics are f32 (f64 for f64 models) whatever the activation dtype.
// The state dict has torchvision's entries: weight, bias, running_mean, running_var, num_batches_tracked.
#pragma once

#include <memory>

#include "core/ops.h"
#include "layers/module.h"

namespace ringtrain {

// What a SyncBatchNorm exchanges with the other replicas of a data-parallel job (core/ops.h,
// BatchNormExchange: an all-gather of the statistics forward, an all-reduce of two per-channel sums
// backward); comm/sync_batchnorm.h makes one over a communicator. A BatchNorm2d given one is a
// SyncBatchNorm.
using CrossReplicaSum = BatchNormExchange;

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double momentum = 0.1, double eps = 1e-5, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) override { return run(x, false); }
  // BN followed by ReLU in one pass.
  Tensor forward_relu(const Tensor& x) { return run(x, true); }
  // relu(bn(x) + residual) in one pass: the end of a residual block.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual) { return run(x, true, residual); }
  std::string type_name() const override { return "BatchNorm2d"; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }
  // Synchronised statistics in training (SyncBatchNorm): batch mean and variance over every replica's
  // batch. Null switches back to local statistics.
  void set_cross_replica(std::shared_ptr<CrossReplicaSum> sum) { cross_replica_ = std::move(sum); }
  bool synchronized() const { return cross_replica_ != nullptr; }

 private:
  Tensor run(const Tensor& x, bool relu, const Tensor& residual = Tensor());
  std::shared_ptr<CrossReplicaSum> cross_replica_;
  int64_t channels_;
  double momentum_, eps_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
};

}  // namespace ringtrain
