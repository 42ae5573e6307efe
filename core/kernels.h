// core/kernels.h: the seam between the op dispatcher (core/ops.cpp) and the device implementations.
// One table of kernels per device type: core/cpu/table.cpp builds the CPU table, core/cuda/table.cpp the
// CUDA table (only compiled with CUDA), each from one file per op family. A null entry is a missing
// kernel: the dispatcher reports it naming the op and device, never falling back silently to another
// device.
//
// Contract for every kernel: all tensors are contiguous and on the table's device; the dispatcher has
// already checked shapes and dtypes and allocated outputs; kernels run on the current stream (CUDA) or
// the CPU thread pool, and are deterministic (no atomics-based floating reductions; integer ones are exact).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace ringtrain {

enum class UnaryOp : uint8_t { Neg, Relu, Exp, Log, Sqrt, Abs, Tanh, Sigmoid };
// Relu: +0 where x <= 0, x elsewhere (NaN stays NaN, as PyTorch's relu and the fused ReLU of batch_norm).
// Comparisons (Eq..Ge) write 0/1 into a U8 output. ReluGrad: out = b > 0 ? a : 0 (relu backward, b = input).
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge, ReluGrad };
// out = x op s. RSub: s - x. RDiv: s / x. Pow: x^s.
enum class ScalarOp : uint8_t { Add, Mul, RSub, RDiv, Pow };
enum class ReduceOp : uint8_t { Sum, Max };

constexpr bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq && op <= BinaryOp::Ge; }

// The activations of today's CNNs, each with its own backward from x (core/ops.h has the formulas):
// Clamp to [a, b] (gradient where a < x < b, none for NaN), Hardtanh to [a, b] (ReLU6; gradient but where x <= a
// or x >= b, so NaN passes it), LeakyRelu (slope a), Gelu (erf), GeluTanh (the tanh approximation), Silu,
// Hardswish, Hardsigmoid: PyTorch 2.15's forward and backward, edges included.
enum class ActivationOp : uint8_t { Clamp, Hardtanh, LeakyRelu, Gelu, GeluTanh, Silu, Hardswish, Hardsigmoid };

// fn(std::integral_constant<ActivationOp, op>{}) for the run-time op, so each kernel is compiled per op with
// the op's arithmetic inlined (CPU and CUDA).
template <typename Fn>
void with_activation_op(ActivationOp op, Fn&& fn) {
  switch (op) {
    case ActivationOp::Clamp:
      return fn(std::integral_constant<ActivationOp, ActivationOp::Clamp>{});
    case ActivationOp::Hardtanh:
      return fn(std::integral_constant<ActivationOp, ActivationOp::Hardtanh>{});
    case ActivationOp::LeakyRelu:
      return fn(std::integral_constant<ActivationOp, ActivationOp::LeakyRelu>{});
    case ActivationOp::Gelu:
      return fn(std::integral_constant<ActivationOp, ActivationOp::Gelu>{});
    case ActivationOp::GeluTanh:
      return fn(std::integral_constant<ActivationOp, ActivationOp::GeluTanh>{});
    case ActivationOp::Silu:
      return fn(std::integral_constant<ActivationOp, ActivationOp::Silu>{});
    case ActivationOp::Hardswish:
      return fn(std::integral_constant<ActivationOp, ActivationOp::Hardswish>{});
    case ActivationOp::Hardsigmoid:
      return fn(std::integral_constant<ActivationOp, ActivationOp::Hardsigmoid>{});
  }
  RT_THROW("activation: unknown op ", static_cast<int>(op));
}

// A strided copy between two tensors' memory, for the ops that move elements without arithmetic (permute,
// narrow, cat, expand and their backward): for every index (i_0, .., i_{ndim-1}) < dims, dst[dst_offset +
// sum i_d * dst_stride[d]] = src[src_offset + sum i_d * src_stride[d]] (element strides and offsets; a source
// stride of 0 repeats, as expand does). Destinations never overlap themselves.
struct StridedCopy {
  int ndim = 0;
  int64_t dims[kMaxDims] = {};
  int64_t src_stride[kMaxDims] = {}, dst_stride[kMaxDims] = {};
  int64_t src_offset = 0, dst_offset = 0;
};

// The same copy over the fewest dims: dims of size 1 dropped, and neighbours merged where both sides step
// through them as one dim (a permute of NHWC to NCHW keeps 3, a cat along C keeps 2: rows and a run). Both
// devices' kernels run the collapsed copy; at least one dim remains.
inline StridedCopy collapse(const StridedCopy& c) {
  StridedCopy o;
  o.src_offset = c.src_offset;
  o.dst_offset = c.dst_offset;
  for (int d = 0; d < c.ndim; ++d) {
    if (c.dims[d] == 1) continue;
    if (o.ndim > 0) {
      const int last = o.ndim - 1;
      if (o.src_stride[last] == c.src_stride[d] * c.dims[d] && o.dst_stride[last] == c.dst_stride[d] * c.dims[d]) {
        o.dims[last] *= c.dims[d];
        o.src_stride[last] = c.src_stride[d];
        o.dst_stride[last] = c.dst_stride[d];
        continue;
      }
    }
    o.dims[o.ndim] = c.dims[d];
    o.src_stride[o.ndim] = c.src_stride[d];
    o.dst_stride[o.ndim] = c.dst_stride[d];
    ++o.ndim;
  }
  if (o.ndim == 0) {  // one element
    o.ndim = 1;
    o.dims[0] = 1;
    o.src_stride[0] = o.dst_stride[0] = 1;
  }
  return o;
}

// Separable resampling of NHWC images: output row p reads input rows index_h[offsets_h[p] ..
// offsets_h[p + 1]) with weights weight_h (the same for columns), and y[n, p, q, c] = sum over those rows i
// and columns j of weight_h[i] * weight_w[j] * x[n, row_i, col_j, c], summed rows outer, columns inner, in
// the tables' order. Adaptive average pooling, nearest and bilinear upsampling are such tables; their
// backward is the same kernel with the transposed tables. offsets and index: I32 on the op's device;
// weights: F64 for f64 tensors, else F32.
struct ResampleTaps {
  Tensor offsets_h, index_h, weight_h;
  Tensor offsets_w, index_w, weight_w;
};

// x viewed as (n, s, c), c channels in `groups` groups (group_norm_forward).
struct GroupNormShape {
  int64_t n = 0, s = 0, c = 0, groups = 1;
};

// Cross-entropy's options as the kernels take them (core/ops.h CrossEntropyOptions): rows whose label is
// ignore_index count for nothing; class_weight (C), in the loss dtype (F32, F64 for f64 logits), weighs each
// row by its label's weight and the smoothing term by each class's weight, as PyTorch does.
struct CrossEntropyArgs {
  double smoothing = 0.0;
  bool has_ignore = false;
  int64_t ignore_index = 0;
  const Tensor* class_weight = nullptr;
};

// Broadcast description shared by all devices: out has `ndim` dims; a_stride[d] / b_stride[d] are the
// element strides of a and b along out's dim d (0 where that input is broadcast).
struct BroadcastDesc {
  int ndim = 0;
  int64_t out_dims[kMaxDims] = {};
  int64_t a_stride[kMaxDims] = {};
  int64_t b_stride[kMaxDims] = {};
};
BroadcastDesc make_broadcast(const Shape& a, const Shape& b, const Shape& out);

// Mixed-precision GEMM request: C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C, row-major.
// lda/ldb/ldc are row-major leading dimensions. All three have the same dtype (f32, f64, f16, bf16);
// 16-bit inputs accumulate in f32. `allow_tf32` lets f32 GEMMs use TF32 tensor cores on GPU.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  double alpha = 1.0, beta = 0.0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool allow_tf32 = true;
};

// Convolution geometry, NHWC activations and KRSC filters: x (N, H, W, C), w (K, R, S, C / groups),
// y (N, P, Q, K). Padding is symmetric; dilation 1 means dense.
struct ConvGeometry {
  int64_t n = 0, h = 0, w = 0, c = 0;  // input
  int64_t k = 0, r = 0, s = 0;         // filters
  int64_t p = 0, q = 0;                // output height, width
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1, groups = 1;
};

// The per-element halves of the exact gradient norm (optim/clip.h), shared by both devices: |x| as
// the bits of an f32 (for x >= 0 the bits order like the values, and a NaN's lie above inf's), and
// floor(x^2 * scale) as an integer (x^2 is exact in f64 for f32/f16/bf16 x; scale, a power of two chosen from
// the largest |x|, keeps it below 2^61).
template <typename S>
RT_HOST_DEVICE inline uint32_t abs_bits(S x) {
  const float f = std::fabs(load_as<float>(x));
  uint32_t u = 0;
  memcpy(&u, &f, sizeof u);
  return u;
}
template <typename S>
RT_HOST_DEVICE inline uint64_t fixed_square(S x, double scale) {
  const double d = load_as<double>(x);
  return static_cast<uint64_t>(d * d * scale);
}

// One fused SGD step over many parameters (PyTorch's update rule), each parameter computed in its
// compute type: g = grad + weight_decay * p; with momentum, buf = (init ? g : momentum * buf +
// (1 - dampening) * g) and d = nesterov ? g + momentum * buf : buf, else d = g; p -= lr * d.
struct SgdTensor {
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;  // param's shape, dtype and device
  Tensor* momentum = nullptr;    // null: no momentum
  double weight_decay = 0.0;
  bool init_momentum = false;  // first step: buf = g
};
struct SgdArgs {
  double lr = 0.0, momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
  // Set: the rate is read from values[0] (F64 on the parameters' device) when the kernel runs, instead of
  // `lr`: a launch captured once in a CUDA graph then serves every step (optim/optimizer.h stage/apply).
  const Tensor* values = nullptr;
};

// The per-element SGD update both devices' sgd_multi_tensor kernels run (C: the compute type; m null
// without momentum). Rounds the momentum buffer to its storage type before using it, as an op-by-op
// update would.
template <typename S, typename C>
RT_HOST_DEVICE inline void sgd_element(S& p, S g, S* m, C weight_decay, C momentum, C keep, C lr, bool init,
                                       bool nesterov) {
  const C pi = load_as<C>(p);
  C gi = load_as<C>(g);
  if (weight_decay != C(0)) gi = gi + pi * weight_decay;
  if (m) {
    *m = store_as<S>(init ? gi : load_as<C>(*m) * momentum + gi * keep);
    gi = nesterov ? gi + load_as<C>(*m) * momentum : load_as<C>(*m);
  }
  p = store_as<S>(pi - lr * gi);
}

// One fused AdamW step over many parameters (PyTorch's rule, decoupled weight decay), each parameter
// computed in its compute type: p *= decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// p -= step_size * m / (sqrt(v * inv_bias2) + eps). decay = 1 - lr * weight_decay (1 without decay),
// step_size = lr / (1 - beta1^t), inv_bias2 = 1 / (1 - beta2^t) with t this parameter's own step count.
// init: the first step; the moments' memory is not read (it may be uninitialised), they start at 0.
struct AdamWTensor {
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;  // param's shape, dtype and device, as are the moments
  Tensor* exp_avg = nullptr;
  Tensor* exp_avg_sq = nullptr;
  double decay = 1.0, step_size = 0.0, inv_bias2 = 1.0;
  bool init = false;
  bool decays = false;  // with AdamWArgs::values: the decay is values[2] (else 1)
};
struct AdamWArgs {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  // Set: step_size, inv_bias2 and (for tensors that decay) decay are read from values[0..2] (F64 on the
  // parameters' device) when the kernel runs, instead of each tensor's fields (see SgdArgs::values).
  const Tensor* values = nullptr;
};

// Square root in the compute type on either side of the CUDA boundary.
template <typename C>
RT_HOST_DEVICE inline C sqrt_as(C x) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<C, float>)
    return sqrtf(x);
  else
    return sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// The per-element AdamW update both devices' adamw_multi_tensor kernels run: the op-by-op update's
// operations in its order, rounding the moments to their storage type before using them; unlike it,
// the decayed parameter and g * g stay in the compute type (for 16-bit storage: more accurate, as
// PyTorch's fused AdamW).
template <typename S, typename C>
RT_HOST_DEVICE inline void adamw_element(S& p, S g, S& m, S& v, C decay, C beta1, C keep1, C beta2, C keep2, C eps,
                                         C step_size, C inv_bias2, bool init) {
  C pi = load_as<C>(p);
  if (decay != C(1)) pi = pi * decay;
  const C gi = load_as<C>(g);
  m = store_as<S>(init ? gi * keep1 : load_as<C>(m) * beta1 + gi * keep1);
  v = store_as<S>(init ? gi * gi * keep2 : load_as<C>(v) * beta2 + gi * gi * keep2);
  const C denom = sqrt_as<C>(load_as<C>(v) * inv_bias2) + eps;
  p = store_as<S>(pi - step_size * (load_as<C>(m) / denom));
}

struct KernelTable {
  // out[i] = value.
  void (*fill)(Tensor& out, double value) = nullptr;
  // dst = src converted to dst.dtype() (same numel). Floating -> integer truncates toward zero.
  void (*convert)(const Tensor& src, Tensor& dst) = nullptr;
  // Floating out only. uniform in [low, high): philox_uniform(seed, stream, i) (f64: philox_uniform_f64).
  void (*uniform)(Tensor& out, uint64_t seed, uint64_t stream, double low, double high) = nullptr;
  // normal: element i = mean + std * sqrt(-2 ln u1) * cos(2 pi u2) with u1 = uniform(seed, stream, 2i),
  // u2 = uniform(seed, stream, 2i+1) (both from philox_uniform, f64 from philox_uniform_f64).
  void (*normal)(Tensor& out, uint64_t seed, uint64_t stream, double mean, double stddev) = nullptr;
  // out = op(x), same shape and dtype (floating; Neg/Abs/Relu also integer).
  void (*unary)(UnaryOp op, const Tensor& x, Tensor& out) = nullptr;
  // out = a op b with broadcasting described by `bc`; a and b share a dtype; out has it (U8 for comparisons).
  void (*binary)(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, const BroadcastDesc& bc) = nullptr;
  // out = x op s, same shape and dtype.
  void (*scalar)(ScalarOp op, const Tensor& x, double s, Tensor& out) = nullptr;
  // x viewed as [outer, n, inner] -> out [outer, inner]. Max also writes argmax (I64, may be null;
  // first index of the maximum). Accumulation in f32 for 16-bit types, f64 for f64, i64 for integers.
  void (*reduce)(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out,
                 Tensor* argmax) = nullptr;
  // C = alpha op(A) op(B) + beta C (see GemmArgs); `batch` independent GEMMs with the given element strides.
  void (*gemm)(const GemmArgs& g, const Tensor& a, const Tensor& b, Tensor& c, int64_t batch, int64_t stride_a,
               int64_t stride_b, int64_t stride_c) = nullptr;
  // x viewed as [rows, cols]; (log-)softmax along cols, numerically stable (max subtracted).
  void (*softmax)(const Tensor& x, int64_t rows, int64_t cols, bool log, Tensor& out) = nullptr;
  // Given y = (log-)softmax(x) and dy: softmax: dx = y * (dy - sum(dy*y)); log: dx = dy - exp(y) * sum(dy).
  void (*softmax_backward)(const Tensor& y, const Tensor& dy, int64_t rows, int64_t cols, bool log,
                           Tensor& dx) = nullptr;
  // Fused softmax cross-entropy with label smoothing eps over logits [rows, cols], labels I32 or I64 [rows].
  // Writes log_probs [rows, cols] (logits' dtype), loss [rows] and row_weight [rows] (both F32 for 16-bit
  // logits, else logits' dtype). Without class weights: loss_r = -(1 - eps) * logp[r, y_r] - (eps / cols) *
  // sum_c logp[r, c] and w_r = 1; with weights wt: loss_r = -(1 - eps) * wt[y_r] * logp[r, y_r] - (eps / cols)
  // * sum_c wt[c] * logp[r, c] and w_r = wt[y_r]; a row whose label is the ignore index: loss_r = w_r = 0.
  // bad_row: I64 [1] on the op's device, set to the first row whose label is outside [0, cols) (and not the
  // ignore index), or to a value >= rows when every label is valid. Written without a host wait
  // (core/device.h's deferred checks).
  void (*cross_entropy)(const Tensor& logits, const Tensor& labels, const CrossEntropyArgs& args, Tensor& log_probs,
                        Tensor& loss, Tensor& row_weight, Tensor& bad_row) = nullptr;
  // dlogits[r, c] = scale * (exp(logp[r, c]) - (1 - eps) [c == y_r] - eps / cols) without class weights; with
  // them scale * ((1 - eps) wt[y_r] (p[r, c] - [c == y_r]) + (eps / cols) (p[r, c] sum wt - wt[c])); 0 for an
  // ignored row. scale = dloss / rows (dloss / sum of the row weights for the weighted mean).
  void (*cross_entropy_backward)(const Tensor& log_probs, const Tensor& labels, const CrossEntropyArgs& args,
                                 double scale, Tensor& dlogits) = nullptr;
  // mask[i] = (philox_uniform(seed, stream, first + i) > p) ? 1/(1-p) : 0 (x's dtype); out = x * mask.
  void (*dropout)(const Tensor& x, double p, uint64_t seed, uint64_t stream, int64_t first, Tensor& out,
                  Tensor& mask) = nullptr;
  // y = conv(x, w) (+ bias broadcast over K when bias != null).
  void (*conv2d_forward)(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvGeometry& g,
                         Tensor& y) = nullptr;
  // dx = conv_transpose(dy, w) (overwrites dx).
  void (*conv2d_backward_data)(const Tensor& dy, const Tensor& w, const ConvGeometry& g, Tensor& dx) = nullptr;
  // dw = correlation of x and dy (overwrites dw); dbias = sum of dy over N, P, Q when dbias != null.
  void (*conv2d_backward_weights)(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw,
                                  Tensor* dbias) = nullptr;
  // Batch norm over x viewed as (M, C) (NHWC: C innermost). training: per-channel batch mean and
  // 1/sqrt(biased var + eps) are computed and written to save_mean / save_invstd; eval: they are
  // computed from running_mean / running_var. y = (x - mean) * invstd * gamma + beta. gamma, beta,
  // running stats and the saved stats are F32 (F64 for f64 inputs). residual (x's shape and dtype, may
  // be null) is added before the ReLU; relu: y = max(y, 0) (fused BN + add + ReLU of residual blocks).
  void (*batch_norm_forward)(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                             const Tensor& running_var, bool training, double eps, bool relu, const Tensor* residual,
                             Tensor& y, Tensor& save_mean, Tensor& save_invstd) = nullptr;
  // Gradients given dy (already masked by the fused ReLU when there was one). training: the full batch
  // statistics gradient; eval: dx = dy * gamma * invstd. dgamma = sum(dy * xhat), dbeta = sum(dy).
  void (*batch_norm_backward)(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                              const Tensor& save_invstd, bool training, Tensor& dx, Tensor& dgamma,
                              Tensor& dbeta) = nullptr;
  // The same for y = relu(bn(x)) without a residual, dy being y's gradient (not masked): the ReLU's mask
  // is recomputed from x, beta and the statistics with the forward's own arithmetic (so it is the forward's
  // bit for bit and the masking costs no pass of its own). The CPU's: f32, f64 and bf16 x; CUDA's: every
  // floating dtype. Optional: when null, ops.cpp masks dy with y first and calls batch_norm_backward.
  void (*batch_norm_relu_backward)(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& save_mean, const Tensor& save_invstd, bool training, Tensor& dx,
                                   Tensor& dgamma, Tensor& dbeta) = nullptr;
  // Training statistics (both here and in batch_norm_forward): two passes in f64, the second taking the
  // deviations from the f64 mean.
  // SyncBatchNorm, exact (ops.h sync_batch_norm): this rank's per-channel count, mean and
  // M2 = sum (x - mean)^2 over x viewed as (M, C), both passes accumulated in f64:
  // stats = F64 (2C + 1) [count, mean (C), M2 (C)], ready to be gathered and merged with Chan's formula.
  void (*batch_norm_stats)(const Tensor& x, Tensor& stats) = nullptr;
  // The normalisation with given statistics (mean and invstd, the parameter dtype): the same fused pass,
  // rounded the same way, as batch_norm_forward's.
  void (*batch_norm_apply)(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                           const Tensor& invstd, bool relu, const Tensor* residual, Tensor& y) = nullptr;
  // The local sums of the backward (dy already ReLU-masked), in f64: sums = F64 (2C) [sum dy (C),
  // sum dy * xhat (C)] with xhat = (x - save_mean) * save_invstd.
  void (*batch_norm_backward_reduce)(const Tensor& x, const Tensor& dy, const Tensor& save_mean,
                                     const Tensor& save_invstd, Tensor& sums) = nullptr;
  // dx = gamma * invstd * (dy - sum dy / count - xhat * sum (dy * xhat) / count), with `sums` (F64 (2C),
  // as above) and `count` over every rank: the backward of statistics taken over all of them.
  void (*batch_norm_backward_elemt)(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                                    const Tensor& save_invstd, const Tensor& sums, double count, Tensor& dx) = nullptr;
  // The running statistics' update after a training pass, in one kernel per batch norm instead of nine
  // element-wise ops: var = 1 / invstd^2 - eps, running_mean = running_mean * (1 - momentum) + mean *
  // momentum, running_var = running_var * (1 - momentum) + var * var_weight, each product, quotient and
  // sum rounded in the parameter dtype exactly as those ops round them (ops.cpp), so the result is theirs
  // bit for bit (but for a -0 product, which the CPU's f32 scalar multiply, x * s + 0, turns into +0).
  // Optional: when null, ops.cpp runs the ops.
  void (*batch_norm_update_running)(const Tensor& save_mean, const Tensor& save_invstd, double eps, double momentum,
                                    double var_weight, Tensor& running_mean, Tensor& running_var) = nullptr;
  // Pooling over NHWC x (N, H, W, C) -> y (N, P, Q, C) with geometry g (k = c, r x s window).
  // Max writes the argmax as a flat h * W + w index per output element (I64); padding never wins.
  void (*max_pool2d_forward)(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax) = nullptr;
  void (*max_pool2d_backward)(const Tensor& dy, const Tensor& argmax, const ConvGeometry& g, Tensor& dx) = nullptr;
  // Average: count_include_pad semantics (divide by r * s), as PyTorch's default.
  void (*avg_pool2d_forward)(const Tensor& x, const ConvGeometry& g, Tensor& y) = nullptr;
  void (*avg_pool2d_backward)(const Tensor& dy, const ConvGeometry& g, Tensor& dx) = nullptr;
  // ---- the pieces of today's CNNs (core/ops.h: cat, permute, where, activations, group and layer norm,
  // resampling, drop_path)
  // dst's elements from src's as `copy` says (StridedCopy); src and dst of one dtype, any dtype.
  void (*strided_copy)(const Tensor& src, Tensor& dst, const StridedCopy& copy) = nullptr;
  // out[i] = cond[i] ? a[i] : b[i] over out's elements; cond U8, a, b and out of one dtype, all of out's size.
  void (*where)(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) = nullptr;
  // y = op(x) with the op's parameters a, b (ActivationOp); floating dtypes, computed in compute_t.
  void (*activation)(ActivationOp op, const Tensor& x, double a, double b, Tensor& y) = nullptr;
  // dx = dy * op'(x).
  void (*activation_backward)(ActivationOp op, const Tensor& x, const Tensor& dy, double a, double b,
                              Tensor& dx) = nullptr;
  // Group normalisation of x viewed as (n, s, c) with c = groups x (c / groups) (NHWC GroupNorm: s = H * W;
  // LayerNorm over the last dim: n rows, s = 1, one group): each (n, group) is normalised over its s x c /
  // groups values with their mean and rstd = 1 / sqrt(biased variance + eps), statistics accumulated in f64 on
  // the CPU and in the compute type (f32 for 16-bit x) on CUDA; y = (x - mean) * rstd * gamma[c] + beta[c]
  // (no affine when gamma and beta are null). gamma, beta: (c) F32 (F64 for f64 x); mean, rstd: (n, groups), the
  // same dtype.
  void (*group_norm_forward)(const Tensor& x, const Tensor* gamma, const Tensor* beta, const GroupNormShape& shape,
                             double eps, Tensor& y, Tensor& mean, Tensor& rstd) = nullptr;
  // dx = rstd * (g - mean_group(g) - xhat * mean_group(g * xhat)) with g = dy * gamma (dy without affine);
  // dgamma[c] = sum over n, s of dy * xhat, dbeta[c] = sum of dy (both null without affine), summed in a fixed
  // order.
  void (*group_norm_backward)(const Tensor& x, const Tensor& dy, const Tensor* gamma, const Tensor& mean,
                              const Tensor& rstd, const GroupNormShape& shape, Tensor& dx, Tensor* dgamma,
                              Tensor* dbeta) = nullptr;
  // y (N, P, Q, C) from x (N, H, W, C) through the tables (ResampleTaps); floating dtypes.
  void (*resample2d)(const Tensor& x, const ResampleTaps& taps, Tensor& y) = nullptr;
  // A per-sample keep mask (drop_path): mask[i] = philox_uniform(seed, stream, first + i) > p ? 1 / (1 - p) : 0,
  // as dropout draws, i over mask's elements; floating dtypes.
  void (*sample_mask)(Tensor& mask, double p, uint64_t seed, uint64_t stream, int64_t first) = nullptr;
  // All tensors on this device with one dtype; on CUDA a handful of launches for the whole model.
  void (*sgd_multi_tensor)(const std::vector<SgdTensor>& tensors, const SgdArgs& args) = nullptr;
  void (*adamw_multi_tensor)(const std::vector<AdamWTensor>& tensors, const AdamWArgs& args) = nullptr;
  // Gradient unscaling for dynamic loss scaling, all grads on this device with one floating dtype:
  // g *= inv_scale, and found_inf (an f32 scalar on the device, zeroed by the caller) becomes 1 if any
  // unscaled element is inf or NaN. Threads may all store that same 1: the result has no order to it.
  void (*unscale_multi_tensor)(const std::vector<Tensor*>& grads, double inv_scale, Tensor& found_inf) = nullptr;
  // The two passes of the exact gradient norm (optim/clip.h), all tensors on this device with one
  // floating dtype. abs_max: out (an I32 scalar, zeroed by the caller) becomes the largest abs_bits()
  // of any element (the sign bit is clear, so as an int32 it orders the same), so NaN beats inf beats every finite
  // value. square_sum: out (I64 (2), zeroed by the caller) gains the sums of the low and of the high 32 bits of
  // fixed_square(x, scale) over every element. Both are integer maxima and sums: exact, so threads and atomics may meet
  // in any order.
  void (*abs_max_multi_tensor)(const std::vector<Tensor*>& grads, Tensor& out) = nullptr;
  void (*square_sum_multi_tensor)(const std::vector<Tensor*>& grads, double scale, Tensor& out) = nullptr;
  // Called by the dispatcher after every op on this device, naming the op: on CUDA it checks
  // cudaGetLastError once per op and, when RINGTRAIN_CUDA_SYNC=1, synchronizes so that asynchronous
  // faults are reported against the op that caused them. Null on the CPU.
  void (*after_op)(const char* op) = nullptr;
};

const KernelTable& cpu_kernels();
// Null when ringtrain was built without CUDA (core/device_nocuda.cpp).
const KernelTable* cuda_kernels();

}  // namespace ringtrain
