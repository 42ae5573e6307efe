// core/ops_norm.cpp: batch norm and SyncBN, forward and backward, the statistics' merge across replicas and the
// tape that lets a recomputed block reuse its forward's batch statistics (BatchNormTape). Checks, dispatch,
// forward and backward, as core/ops.cpp.
#include <algorithm>
#include <cmath>
#include <optional>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/dispatch.h"
#include "core/ops.h"
#include "core/ops_internal.h"
#include "core/pack.h"

namespace ringtrain {

using detail::check_floating;
using detail::check_same_device_dtype;
using detail::Grads;

// ---------------------------------------------------------------------------------------------------
// The tape of batch statistics

namespace {
thread_local BatchNormTape::Scope* innermost_tape = nullptr;
}  // namespace

BatchNormTape::Scope::Scope(BatchNormTape& tape, Mode mode) : tape_(tape), mode_(mode), outer_(innermost_tape) {
  if (mode == Mode::kReplay) tape.next_ = 0;
  innermost_tape = this;
}

BatchNormTape::Scope::~Scope() { innermost_tape = outer_; }

std::optional<BatchNormTape::Entry> BatchNormTape::replay(const char* op, const Tensor& x, bool sync) {
  if (!x.device().is_cpu()) return std::nullopt;
  Scope* s = innermost_tape;
  while (s && s->mode_ != Mode::kReplay) s = s->outer_;
  if (!s) return std::nullopt;
  BatchNormTape& t = s->tape_;
  const int64_t C = x.size(-1);
  RT_CHECK(t.next_ < t.entries_.size(), "op '", op, "' on ", x.describe(), ": the recompute ran batch norm ",
           t.next_ + 1, " but the forward it repeats ran ", t.entries_.size(),
           " (a recomputed block must run the same ops from the same input)");
  const Entry& e = t.entries_[t.next_];
  if (e.mean.numel() != C || (e.count > 0) != sync)
    RT_THROW("op '", op, "' on ", x.describe(), ": the recompute's batch norm ", t.next_ + 1, " is not the forward's (",
             e.count > 0 ? "sync_batch_norm" : "batch_norm", " of ", e.mean.numel(),
             " channels); a recomputed block must run the same ops from the same input");
  ++t.next_;
  return e;
}

void BatchNormTape::record(const Tensor& x, const Entry& e) {
  if (!x.device().is_cpu()) return;
  for (Scope* s = innermost_tape; s; s = s->outer_)
    if (s->mode_ == Mode::kRecord) s->tape_.entries_.push_back(e);
}

namespace {
// The checks batch_norm and sync_batch_norm share; returns the parameter dtype. local_batch: the
// statistics are this batch's alone, so it needs two values per channel (SyncBN checks the union).
DType check_batch_norm(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, bool local_batch, double momentum,
                       double eps, const Tensor& residual) {
  check_floating(op, x);
  RT_CHECK(x.ndim() >= 2, "op '", op, "': expected (N, ..., C), got ", x.describe());
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  const DType param_dtype = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  for (const Tensor* t : {&weight, &bias, &running_mean, &running_var}) {
    RT_CHECK(t->defined(), "op '", op, "': undefined parameter or statistic");
    if (t->ndim() != 1 || t->size(0) != C || t->dtype() != param_dtype || t->device() != x.device())
      RT_THROW("op '", op, "': ", t->describe(), " must be ", dtype_name(param_dtype), "[", C, "] on ",
               x.device().str(), " for input ", x.describe());
  }
  if (local_batch && M < 2)
    RT_THROW("op '", op, "': training needs more than one value per channel, got input ", x.describe());
  if (residual.defined()) {
    check_same_device_dtype(op, x, residual);
    if (!(residual.shape() == x.shape()))
      RT_THROW("op '", op, "': residual ", residual.describe(), " must have the input's shape ", x.shape());
  }
  if (!(eps > 0) || !(momentum >= 0 && momentum <= 1))
    RT_THROW("op '", op, "': eps must be > 0 and momentum in [0, 1], got eps=", eps, " momentum=", momentum);
  return param_dtype;
}

// running = (1 - momentum) running + momentum batch; the variance's weight carries its own factor (plain
// batch norm turns the biased variance into the unbiased one with it).
void update_running_statistics(const Tensor& running_mean, const Tensor& running_var, const Tensor& mean,
                               const Tensor& var, double momentum, double var_weight) {
  NoGradGuard no_grad;
  Tensor(running_mean).copy_(add(mul(running_mean, 1.0 - momentum), mul(mean, momentum)));
  Tensor(running_var).copy_(add(mul(running_var, 1.0 - momentum), mul(var, var_weight)));
}

// The output gradient through a fused ReLU (y: the op's output, undefined without one). Masked in place
// when the backward was handed dy and nothing else holds it (autograd's engine passes gradients on).
Tensor relu_masked(const Tensor& dy, const Tensor& y, const char* op) {
  if (!y.defined()) return dy;
  Tensor masked = dy.sole_owner() ? dy : Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  RT_KERNEL(dy.device(), op, binary)
  (BinaryOp::ReluGrad, dy, y, masked, make_broadcast(dy.shape(), y.shape(), dy.shape()));
  return masked;
}
}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps, bool fuse_relu,
                  const Tensor& residual) {
  const DType param_dtype =
      check_batch_norm("batch_norm", x, weight, bias, running_mean, running_var, training, momentum, eps, residual);
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const Tensor* residual_ptr = residual.defined() ? &residual : nullptr;
  const std::optional<BatchNormTape::Entry> replayed =
      training ? BatchNormTape::replay("batch_norm", x, false) : std::nullopt;
  Tensor save_mean, save_invstd;
  if (replayed) {
    save_mean = replayed->mean;
    save_invstd = replayed->invstd;
    RT_KERNEL(x.device(), "batch_norm", batch_norm_apply)
    (x, weight, bias, save_mean, save_invstd, fuse_relu, residual_ptr, y);
  } else {
    save_mean = Tensor::empty(Shape{C}, param_dtype, x.device());
    save_invstd = Tensor::empty(Shape{C}, param_dtype, x.device());
    RT_KERNEL(x.device(), "batch_norm", batch_norm_forward)
    (x, weight, bias, running_mean, running_var, training, eps, fuse_relu, residual_ptr, y, save_mean, save_invstd);
  }
  detail::after_op(x.device(), "batch_norm");
  if (training && !replayed) {
    NoGradGuard no_grad;
    // Biased batch variance from the saved 1/sqrt(var + eps); running_var uses the unbiased one.
    const double var_weight = momentum * static_cast<double>(M) / (M - 1);
    if (detail::kernel_table(x.device(), "batch_norm").batch_norm_update_running) {  // the same bits in one kernel
      Tensor rm = running_mean, rv = running_var;
      RT_KERNEL(x.device(), "batch_norm", batch_norm_update_running)
      (save_mean, save_invstd, eps, momentum, var_weight, rm, rv);
      detail::after_op(x.device(), "batch_norm");
    } else {
      Tensor var = add(rdiv(mul(save_invstd, save_invstd), 1.0), -eps);
      update_running_statistics(running_mean, running_var, save_mean, var, momentum, var_weight);
    }
  }
  if (training) BatchNormTape::record(x, {save_mean, save_invstd, 0});
  if (!needs_grad({&x, &weight, &bias, &residual})) return y;
  const bool has_residual = residual.defined();
  const char* name = has_residual ? (fuse_relu ? "batch_norm_add_relu" : "batch_norm_add")
                                  : (fuse_relu ? "batch_norm_relu" : "batch_norm");
  // BN + ReLU without a residual: the backward recomputes the ReLU's mask from x where the device can (no
  // y kept, no masking pass); otherwise dy is masked with y first.
  const auto fused_backward = detail::kernel_table(x.device(), "batch_norm").batch_norm_relu_backward;
  const bool mask_from_x = fuse_relu && !has_residual && fused_backward &&
                           (x.dtype() == DType::F32 || x.dtype() == DType::F64 || x.device().is_cuda() ||
                            (x.dtype() == DType::BF16 && x.device().is_cpu()));
  // Otherwise the mask is kept: on the CPU (f32) as bits, 1/32 of y, which is then not held by this op
  // (a block's output, kept by nothing else once the next block has its input packed or recomputed).
  const bool mask_bits = fuse_relu && !mask_from_x && x.device().is_cpu() && x.dtype() == DType::F32;
  Tensor sx = x.detach(), sw = weight.detach();
  Tensor sy = fuse_relu && !mask_from_x && !mask_bits ? y.detach() : Tensor();
  Tensor sbits = mask_bits ? positive_bits(y) : Tensor(), sb = mask_from_x ? bias.detach() : Tensor();
  return record(
      name, {&x, &weight, &bias, &residual}, y,
      [sx, sw, sy, sbits, sb, save_mean, save_invstd, training, has_residual, mask_from_x](const Tensor& dy_in) {
        Tensor dy;
        if (sbits.defined()) {
          // Masked in place when the backward was handed dy_in and nothing else holds it.
          dy = dy_in.sole_owner() ? dy_in : Tensor::empty(dy_in.shape(), dy_in.dtype(), dy_in.device());
          mask_by_bits(dy_in, sbits, dy);
        } else {
          dy = relu_masked(dy_in, sy, "batch_norm_backward");  // dy_in itself without sy
        }
        Tensor dx = Tensor::empty(sx.shape(), sx.dtype(), sx.device());
        Tensor dw = Tensor::empty(sw.shape(), sw.dtype(), sw.device());
        Tensor db = Tensor::empty(sw.shape(), sw.dtype(), sw.device());
        if (mask_from_x) {  // through RT_KERNEL, so the profiler times it as bn_bwd
          RT_KERNEL(dy.device(), "batch_norm_backward", batch_norm_relu_backward)
          (sx, dy, sw, sb, save_mean, save_invstd, training, dx, dw, db);
        } else {
          RT_KERNEL(dy.device(), "batch_norm_backward", batch_norm_backward)
          (sx, dy, sw, save_mean, save_invstd, training, dx, dw, db);
        }
        detail::after_op(dy.device(), "batch_norm_backward");
        // The residual's gradient is the (ReLU-masked) output gradient itself.
        return Grads{dx, dw, db, has_residual ? dy : Tensor()};
      });
}

namespace {

// Chan, Golub and LeVeque's parallel merge of per-replica (count, mean, M2), in replica order: exact where
// E[x^2] - E[x]^2 would cancel, and the same bits on every replica (they merge the same numbers in the
// same order). gathered: (replicas x (2C + 1)) [count, mean (C), M2 (C)]. Returns the total count.
double merge_statistics(const Tensor& gathered, int64_t C, std::vector<double>& mean, std::vector<double>& m2) {
  const int64_t row = 2 * C + 1;
  RT_CHECK(gathered.numel() % row == 0, "sync_batch_norm: gathered ", gathered.numel(),
           " statistics, not a whole number of replicas of ", C, " channels (do all replicas have the same model?)");
  const double* g = gathered.data<double>();
  mean.assign(static_cast<size_t>(C), 0.0);
  m2.assign(static_cast<size_t>(C), 0.0);
  double total = 0;
  for (int64_t r = 0; r < gathered.numel() / row; ++r) {
    const double* s = g + r * row;
    const double n = s[0];
    if (n <= 0) continue;
    const double merged = total + n;
    for (int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<size_t>(c);
      const double delta = s[1 + c] - mean[i];
      mean[i] += delta * (n / merged);
      m2[i] += s[1 + C + c] + delta * delta * (total * n / merged);
    }
    total = merged;
  }
  return total;
}

}  // namespace

Tensor sync_batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, double momentum, double eps, bool fuse_relu, const Tensor& residual,
                       const std::shared_ptr<BatchNormExchange>& exchange) {
  const DType param_dtype =
      check_batch_norm("sync_batch_norm", x, weight, bias, running_mean, running_var, false, momentum, eps, residual);
  RT_CHECK(exchange, "op 'sync_batch_norm': no exchange with the other replicas");
  const int64_t C = x.size(-1);
  const Device device = x.device();
  // A recompute takes the first run's merged statistics: no reduction, no exchange (every replica
  // recomputes the same blocks, so none waits for one that skipped it).
  std::optional<BatchNormTape::Entry> stats = BatchNormTape::replay("sync_batch_norm", x, true);
  if (!stats) {
    Tensor local = Tensor::empty(Shape{2 * C + 1}, DType::F64, device);
    RT_KERNEL(device, "sync_batch_norm", batch_norm_stats)(x, local);
    detail::after_op(device, "sync_batch_norm");
    std::vector<double> mean, m2;
    const double count = merge_statistics(exchange->all_gather(local).to(Device::cpu()), C, mean, m2);
    RT_CHECK(count > 1, "op 'sync_batch_norm': training needs more than one value per channel over all replicas, got ",
             count, " (input ", x.describe(), ")");
    // The saved statistics exactly as batch_norm's training pass rounds them: on one replica SyncBN is plain
    // batch norm bit for bit.
    std::vector<double> invstd(m2.size()), unbiased(m2.size());
    for (size_t c = 0; c < m2.size(); ++c) {
      invstd[c] = 1.0 / std::sqrt(m2[c] / count + eps);
      unbiased[c] = m2[c] / (count - 1);
    }
    stats = BatchNormTape::Entry{Tensor::from_vector(mean, Shape{C}, param_dtype, device),
                                 Tensor::from_vector(invstd, Shape{C}, param_dtype, device), count};
    update_running_statistics(running_mean, running_var, stats->mean,
                              Tensor::from_vector(unbiased, Shape{C}, param_dtype, device), momentum, momentum);
  }
  BatchNormTape::record(x, *stats);
  const Tensor save_mean = stats->mean, save_invstd = stats->invstd;
  const double count = stats->count;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  const Tensor* residual_ptr = residual.defined() ? &residual : nullptr;
  RT_KERNEL(device, "sync_batch_norm", batch_norm_apply)
  (x, weight, bias, save_mean, save_invstd, fuse_relu, residual_ptr, y);
  detail::after_op(device, "sync_batch_norm");
  if (!needs_grad({&x, &weight, &bias, &residual})) return y;
  Tensor sx = x.detach(), sw = weight.detach(), sy = fuse_relu ? y.detach() : Tensor();
  const bool has_residual = residual.defined();
  return record(
      "sync_batch_norm", {&x, &weight, &bias, &residual}, y,
      [sx, sw, sy, save_mean, save_invstd, has_residual, exchange, count, C, param_dtype](const Tensor& dy_in) {
        NoGradGuard no_grad;
        const Tensor dy = relu_masked(dy_in, sy, "sync_batch_norm_backward");
        Tensor sums = Tensor::empty(Shape{2 * C}, DType::F64, dy.device());
        RT_KERNEL(dy.device(), "sync_batch_norm_backward", batch_norm_backward_reduce)
        (sx, dy, save_mean, save_invstd, sums);
        // This replica's parameter gradients; the sums over every replica for dx.
        Tensor dbeta = sums.slice(0, C).to(param_dtype), dgamma = sums.slice(C, 2 * C).to(param_dtype);
        Tensor global = sums.clone();
        exchange->all_reduce_sum(global);
        Tensor dx = Tensor::empty(sx.shape(), sx.dtype(), sx.device());
        RT_KERNEL(dy.device(), "sync_batch_norm_backward", batch_norm_backward_elemt)
        (sx, dy, sw, save_mean, save_invstd, global, count, dx);
        detail::after_op(dy.device(), "sync_batch_norm_backward");
        return Grads{dx, dgamma, dbeta, has_residual ? dy : Tensor()};
      });
}

}  // namespace ringtrain
