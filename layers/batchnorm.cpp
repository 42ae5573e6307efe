// layers/batchnorm.cpp: BatchNorm2d; the kernels live in core (core/cpu/norm_pool.cpp).
#include "layers/batchnorm.h"

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"

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
  if (x.ndim() != 4 || x.size(3) != channels_)
    RT_THROW("BatchNorm2d(", channels_, ") '", weight_.name(), "': input ", x.describe(), " must be (N, H, W, ",
             channels_, ")");
  if (is_training()) {
    NoGradGuard no_grad;
    Tensor(num_batches_tracked_).add_(Tensor::ones(Shape{}, DType::I64, num_batches_tracked_.device()));
  }
  if (cross_replica_ && is_training()) return run_synchronized(x, relu, residual);
  return batch_norm(x, weight_, bias_, running_mean_, running_var_, is_training(), momentum_, eps_, relu, residual);
}

// SyncBatchNorm, composed from differentiable ops: per-channel sums of d = x - shift and d^2 over the
// local batch, summed over replicas (the cross-replica sum is differentiable), give the global mean and
// biased variance; autograd then carries the gradient through both sums, which is exactly the
// synchronised backward (the per-channel sums of dy and dy*x-hat are all-reduced). The shift is the
// running mean (identical on every replica, since every replica updates it from the same global
// statistics): once it tracks the data, E[d^2] - E[d]^2 no longer cancels catastrophically when
// |mean| >> std (the first steps, with running mean 0, are no better than plain E[x^2] - E[x]^2).
// Statistics accumulate in f32 (f64 for f64 models) whatever the activation dtype.
Tensor BatchNorm2d::run_synchronized(const Tensor& x, bool relu, const Tensor& residual) {
  const DType p = weight_.dtype();
  const Tensor xs = x.dtype() == p ? x : x.to(p);
  const int64_t local_count = x.numel() / channels_;
  const Tensor shift = running_mean_.detach().clone();
  const Tensor d = sub(xs.reshape(Shape{local_count, channels_}), shift);
  const Tensor sum = cross_replica_->sum(ringtrain::sum(d, 0));
  const Tensor sum_sq = cross_replica_->sum(ringtrain::sum(mul(d, d), 0));
  const double count = cross_replica_->sum_count(static_cast<double>(local_count), x.device());
  RT_CHECK(count > 1, "SyncBatchNorm '", weight_.name(), "': needs more than one value per channel over all ",
           "replicas, got ", count);
  const Tensor mean_d = mul(sum, 1.0 / count);
  const Tensor mean = add(mean_d, shift);
  const Tensor var =
      maximum(sub(mul(sum_sq, 1.0 / count), mul(mean_d, mean_d)), Tensor::zeros(Shape{channels_}, p, x.device()));
  const Tensor scale = mul(pow(add(var, eps_), -0.5), weight_);
  Tensor y = add(mul(sub(xs, mean), scale), bias_);
  if (residual.defined()) y = add(y, residual.dtype() == p ? residual : residual.to(p));
  if (relu) y = ringtrain::relu(y);
  {
    NoGradGuard no_grad;
    Tensor rm(running_mean_), rv(running_var_);
    rm.copy_(add(mul(rm, 1.0 - momentum_), mul(mean.detach(), momentum_)));
    rv.copy_(add(mul(rv, 1.0 - momentum_), mul(var.detach(), momentum_ * count / (count - 1))));
  }
  return y.dtype() == x.dtype() ? y : y.to(x.dtype());
}

}  // namespace ringtrain
