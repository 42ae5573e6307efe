// layers/batchnorm.cpp: BatchNorm2d; the kernels live in core (core/cpu/norm_pool.cpp).
#include "layers/batchnorm.h"

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/profile.h"

namespace ringtrain {

BatchNorm2d::BatchNorm2d(int64_t channels, double momentum, double eps, DType dtype)
    : channels_(channels), momentum_(momentum), eps_(eps) {
  RT_CHECK(channels > 0, "BatchNorm2d: channels must be positive, got ", channels);
  const DType p = dtype == DType::F64 ? DType::F64 : DType::F32;
  weight_ = register_parameter("weight", Tensor::ones(Shape{channels}, p));
  bias_ = register_parameter("bias", Tensor::zeros(Shape{channels}, p));
  running_mean_ = register_buffer("running_mean", Tensor::zeros(Shape{channels}, p));
  running_var_ = register_buffer("running_var", Tensor::ones(Shape{channels}, p));
  num_batches_tracked_ = register_buffer("num_batches_tracked", Tensor::zeros(Shape{}, DType::I64));
}

Tensor BatchNorm2d::run(const Tensor& x, bool relu, const Tensor& residual) {
  profile::LayerScope layer(path());
  use_parameters();
  if (x.ndim() != 4 || x.size(3) != channels_)
    RT_THROW("BatchNorm2d(", channels_, ") '", weight_.name(), "': input ", x.describe(), " must be (N, H, W, ",
             channels_, ")");
  if (is_training()) {
    NoGradGuard no_grad;
    Tensor(num_batches_tracked_).add_(Tensor::ones(Shape{}, DType::I64, num_batches_tracked_.device()));
  }
  // SyncBatchNorm: statistics over every replica's batch (exact, core/ops.h), fused like plain batch norm.
  // Statistics stay f32 (f64 for f64 models) whatever the activation dtype.
  if (cross_replica_ && is_training())
    return sync_batch_norm(x, weight_, bias_, running_mean_, running_var_, momentum_, eps_, relu, residual,
                           cross_replica_);
  return batch_norm(x, weight_, bias_, running_mean_, running_var_, is_training(), momentum_, eps_, relu, residual);
}

}  // namespace ringtrain
