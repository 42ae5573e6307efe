// core/cpu/norm_pool.cpp: batch norm (with optional fused ReLU) and max/average pooling on NHWC
// tensors. Per-channel statistics are summed in fixed row blocks combined in order, so results do
// not depend on the thread count; the f32 loops are compiled per ISA with the portable loops' bits.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/dtype_visit.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

constexpr int64_t kRowBlock = 256;  // rows of (M, C) per statistics block

// fn(a value of the storage type) for the floating dtypes, through core/dtype_visit.h's one dispatch.
template <typename Fn>
void visit_float(DType t, const char* op, Fn&& fn) {
  visit_floating(
      t, [&](auto tag) { fn(typename decltype(tag)::type{}); },
      [&] { RT_THROW("op '", op, "' has no CPU kernel for dtype ", dtype_name(t)); });
}

template <typename S>
using acc_t = std::conditional_t<std::is_same_v<S, double>, double, float>;

// Per-channel sums over the rows of an (M, C) view, `count` of them per channel: add(r0, r1, acc) adds rows
// [r0, r1) into acc (count x C, f64). Rows go in blocks of kRowBlock, each summed from zero, and the
// blocks are combined in order, so the result does not depend on the thread count. Returns count x C.
template <typename Add>
std::vector<double> blocked_sums(int64_t rows, int64_t channels, int64_t count, Add&& add) {
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock, width = count * channels;
  std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(blocks, 1) * width), 0.0);
  parallel_for(blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b)
      add(b * kRowBlock, std::min(rows, (b + 1) * kRowBlock), partial.data() + b * width);
  });
  std::vector<double> total(static_cast<size_t>(width), 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < width; ++i) total[static_cast<size_t>(i)] += partial[static_cast<size_t>(b * width + i)];
  return total;
}

// One sum per channel of f(row, c).
template <typename F>
std::vector<double> channel_sums(int64_t rows, int64_t channels, F&& f) {
  return blocked_sums(rows, channels, 1, [&](int64_t r0, int64_t r1, double* acc) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < channels; ++c) acc[c] += f(r, c);
  });
}

// Stores of the compiled rows: f32 as is, bf16 rounded as store_as does, without its branch.
[[gnu::always_inline]] inline float store_row(float v, float*) { return v; }
[[gnu::always_inline]] inline BFloat16 store_row(float v, BFloat16*) { return to_bf16_flat(v); }

// The inner loops of the statistics and of the element-wise passes for f32 and bf16 storage (bf16 loads
// widen to f32 and stores round to nearest even, as load_as/store_as), compiled per ISA (RT_MULTIVERSION)
// so that they run 8 or 16 channels at a time. Each channel's operations are the portable loop's, in the
// same order (this file is built with -ffp-contract=off: no FMA fusion), so the bits do not depend on the
// CPU; vectorising across channels never reorders a channel's own additions.
template <typename S>
[[gnu::always_inline]] inline void rows_sum(const S* x, int64_t r0, int64_t r1, int64_t C, double* acc) {
  for (int64_t r = r0; r < r1; ++r) {
    const S* row = x + r * C;
    for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<double>(load_as<float>(row[c]));
  }
}

template <typename S>
[[gnu::always_inline]] inline void rows_m2(const S* x, int64_t r0, int64_t r1, int64_t C, const double* mean,
                                           double* acc) {
  for (int64_t r = r0; r < r1; ++r) {
    const S* row = x + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const double d = static_cast<double>(load_as<float>(row[c])) - mean[c];
      acc[c] += d * d;
    }
  }
}

// The output gradient of row element c, through the fused ReLU when scale is set: the forward's own
// x * scale + shift (same operations, no contraction) decides, so the mask is the forward's bit for bit:
// y > 0 where y is that value as stored (f32 as is; bf16 rounded, which a positive value below half
// bf16's smallest subnormal does to zero).
template <bool Relu, typename S>
[[gnu::always_inline]] inline float masked_dy(const S* xr, const S* dr, int64_t c, const float* scale,
                                              const float* shift) {
  if constexpr (!Relu) return load_as<float>(dr[c]);
  const float v = load_as<float>(xr[c]) * scale[c] + shift[c];
  // bf16: v rounds to a positive value exactly when it exceeds the f32 subnormal of bits 0x8000 (half bf16's
  // smallest subnormal; that one itself ties to even, to zero), so one compare is the rounded y > 0.
  const float above = std::is_same_v<S, float> ? 0.0f : bits_f32(0x8000u);
  // dy where the forward's y > 0, else +0: as an AND of the bits (a select here stayed a branch, unvectorised).
  const uint32_t keep = 0u - static_cast<uint32_t>(v > above);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(load_as<float>(dr[c])) & keep);
}

template <bool Relu, typename S>
[[gnu::always_inline]] inline void rows_backward_sums(const S* x, const S* dy, int64_t r0, int64_t r1, int64_t C,
                                                      const double* mean, const double* invstd, const float* scale,
                                                      const float* shift, double* acc) {
  for (int64_t r = r0; r < r1; ++r) {
    const S *xr = x + r * C, *dr = dy + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const double g = static_cast<double>(masked_dy<Relu>(xr, dr, c, scale, shift));
      const double xhat = (static_cast<double>(load_as<float>(xr[c])) - mean[c]) * invstd[c];
      acc[c] += g;
      acc[C + c] += g * xhat;
    }
  }
}

template <typename S>
[[gnu::always_inline]] inline void rows_apply(const S* x, const S* residual, S* y, int64_t r0, int64_t r1, int64_t C,
                                              const float* scale, const float* shift, bool relu) {
  for (int64_t r = r0; r < r1; ++r) {
    const S* xr = x + r * C;
    const S* rr = residual ? residual + r * C : nullptr;
    S* yr = y + r * C;
    for (int64_t c = 0; c < C; ++c) {
      float v = load_as<float>(xr[c]) * scale[c] + shift[c];
      if (rr) v += load_as<float>(rr[c]);
      if (relu && v < 0.0f) v = 0.0f;
      yr[c] = store_row(v, yr);
    }
  }
}

template <bool Relu, typename S>
[[gnu::always_inline]] inline void rows_dx(const S* x, const S* dy, S* dx, int64_t r0, int64_t r1, int64_t C,
                                           const float* mean, const float* invstd, const float* k1, const float* k2,
                                           const float* k3, const float* scale, const float* shift) {
  for (int64_t r = r0; r < r1; ++r) {
    const S *xr = x + r * C, *dr = dy + r * C;
    S* out = dx + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (load_as<float>(xr[c]) - mean[c]) * invstd[c];
      const float g = masked_dy<Relu>(xr, dr, c, scale, shift);
      out[c] = store_row(g * k1[c] - k2[c] - xhat * k3[c], out);
    }
  }
}

// One compiled function per storage type and pass (target_clones takes no templates); the overloads let
// the templated callers below pick theirs.
#define RT_ROWS_FOR(S)                                                                                                \
  RT_MULTIVERSION void fast_rows_sum(const S* x, int64_t r0, int64_t r1, int64_t C, double* acc) {                    \
    rows_sum(x, r0, r1, C, acc);                                                                                      \
  }                                                                                                                   \
  RT_MULTIVERSION void fast_rows_m2(const S* x, int64_t r0, int64_t r1, int64_t C, const double* mean, double* acc) { \
    rows_m2(x, r0, r1, C, mean, acc);                                                                                 \
  }                                                                                                                   \
  RT_MULTIVERSION void fast_rows_backward_sums(const S* x, const S* dy, int64_t r0, int64_t r1, int64_t C,            \
                                               const double* mean, const double* invstd, const float* scale,          \
                                               const float* shift, double* acc) {                                     \
    if (scale)                                                                                                        \
      rows_backward_sums<true>(x, dy, r0, r1, C, mean, invstd, scale, shift, acc);                                    \
    else                                                                                                              \
      rows_backward_sums<false>(x, dy, r0, r1, C, mean, invstd, scale, shift, acc);                                   \
  }                                                                                                                   \
  RT_MULTIVERSION void fast_rows_apply(const S* x, const S* residual, S* y, int64_t r0, int64_t r1, int64_t C,        \
                                       const float* scale, const float* shift, bool relu) {                           \
    rows_apply(x, residual, y, r0, r1, C, scale, shift, relu);                                                        \
  }                                                                                                                   \
  RT_MULTIVERSION void fast_rows_dx(const S* x, const S* dy, S* dx, int64_t r0, int64_t r1, int64_t C,                \
                                    const float* mean, const float* invstd, const float* k1, const float* k2,         \
                                    const float* k3, const float* scale, const float* shift) {                        \
    if (scale)                                                                                                        \
      rows_dx<true>(x, dy, dx, r0, r1, C, mean, invstd, k1, k2, k3, scale, shift);                                    \
    else                                                                                                              \
      rows_dx<false>(x, dy, dx, r0, r1, C, mean, invstd, k1, k2, k3, scale, shift);                                   \
  }

RT_ROWS_FOR(float)
RT_ROWS_FOR(BFloat16)
#undef RT_ROWS_FOR

// f32 and bf16 storage take the compiled rows; f16 and f64 the portable loops.
template <typename S>
constexpr bool kFastRows = std::is_same_v<S, float> || std::is_same_v<S, BFloat16>;

// The forward's per-channel scale = gamma * invstd and shift = beta - mean * gamma * invstd, rounded to the
// accumulator type (apply and the fused ReLU's backward mask share them).
template <typename A, typename P>
void scale_and_shift(const P* pg, const P* pb, const P* pm, const P* pi, int64_t C, std::vector<A>& scale,
                     std::vector<A>& shift) {
  scale.resize(static_cast<size_t>(C));
  shift.resize(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    scale[static_cast<size_t>(c)] = static_cast<A>(pg[c] * pi[c]);
    shift[static_cast<size_t>(c)] = static_cast<A>(pb[c] - pm[c] * pg[c] * pi[c]);
  }
}

// y = x * scale + shift per channel (+ residual, ReLU), scale = gamma * invstd, shift = beta - mean * scale.
template <typename S, typename P>
void apply_batch_norm(const Tensor& x, const P* pg, const P* pb, const P* pm, const P* pi, bool relu,
                      const Tensor* residual, Tensor& y) {
  using A = acc_t<S>;
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  const S* px = x.data<S>();
  S* py = y.data<S>();
  std::vector<A> scale, shift;
  scale_and_shift(pg, pb, pm, pi, C, scale, shift);
  const S* pres = residual ? residual->data<S>() : nullptr;
  parallel_for(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
    if constexpr (kFastRows<S>) {
      fast_rows_apply(px, pres, py, lo, hi, C, scale.data(), shift.data(), relu);
      return;
    }
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t c = 0; c < C; ++c) {
        A v = load_as<A>(px[r * C + c]) * scale[static_cast<size_t>(c)] + shift[static_cast<size_t>(c)];
        if (pres) v += load_as<A>(pres[r * C + c]);
        if (relu && v < A(0)) v = A(0);
        py[r * C + c] = store_as<S>(v);
      }
  });
}

// Per-channel mean and M2 = sum (x - mean)^2 of an (M, C) view in two passes, both in f64 and the second
// from the f64 mean: a mean that dwarfs the spread costs no digits.
template <typename S>
void mean_and_m2(const S* px, int64_t M, int64_t C, std::vector<double>& mean, std::vector<double>& m2) {
  using A = acc_t<S>;
  if constexpr (kFastRows<S>) {
    mean = blocked_sums(M, C, 1, [&](int64_t r0, int64_t r1, double* acc) { fast_rows_sum(px, r0, r1, C, acc); });
  } else {
    mean = channel_sums(M, C, [&](int64_t r, int64_t c) { return static_cast<double>(load_as<A>(px[r * C + c])); });
  }
  for (double& v : mean) v = M > 0 ? v / static_cast<double>(M) : 0.0;
  if constexpr (kFastRows<S>) {
    m2 = blocked_sums(M, C, 1,
                      [&](int64_t r0, int64_t r1, double* acc) { fast_rows_m2(px, r0, r1, C, mean.data(), acc); });
  } else {
    m2 = channel_sums(M, C, [&](int64_t r, int64_t c) {
      const double d = static_cast<double>(load_as<A>(px[r * C + c])) - mean[static_cast<size_t>(c)];
      return d * d;
    });
  }
}

void batch_norm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                        const Tensor& running_var, bool training, double eps, bool relu, const Tensor* residual,
                        Tensor& y, Tensor& save_mean, Tensor& save_invstd) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  visit_float(x.dtype(), "batch_norm", [&](auto tag) {
    using S = decltype(tag);
    using P = std::conditional_t<std::is_same_v<S, double>, double, float>;  // parameter / stats dtype
    P *pm = save_mean.data<P>(), *pi = save_invstd.data<P>();
    if (training) {
      std::vector<double> mean, m2;
      mean_and_m2(x.data<S>(), M, C, mean, m2);
      for (int64_t c = 0; c < C; ++c) {
        pm[c] = static_cast<P>(mean[static_cast<size_t>(c)]);
        pi[c] = static_cast<P>(1.0 / std::sqrt(m2[static_cast<size_t>(c)] / static_cast<double>(M) + eps));
      }
    } else {
      const P *rm = running_mean.data<P>(), *rv = running_var.data<P>();
      for (int64_t c = 0; c < C; ++c) {
        pm[c] = rm[c];
        pi[c] = static_cast<P>(1.0 / std::sqrt(static_cast<double>(rv[c]) + eps));
      }
    }
    apply_batch_norm<S, P>(x, gamma.data<P>(), beta.data<P>(), pm, pi, relu, residual, y);
  });
}

void batch_norm_apply(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                      const Tensor& invstd, bool relu, const Tensor* residual, Tensor& y) {
  visit_float(x.dtype(), "batch_norm_apply", [&](auto tag) {
    using S = decltype(tag);
    using P = std::conditional_t<std::is_same_v<S, double>, double, float>;
    apply_batch_norm<S, P>(x, gamma.data<P>(), beta.data<P>(), mean.data<P>(), invstd.data<P>(), relu, residual, y);
  });
}

// The output gradient through a fused ReLU recomputed from x (relu_scale, relu_shift: the forward's, or
// null for no ReLU), in the accumulator type, for the portable loops.
template <typename A, typename S>
A masked_dy_portable(const S* px, const S* pdy, int64_t r, int64_t c, int64_t C, const A* relu_scale,
                     const A* relu_shift) {
  const A g = load_as<A>(pdy[r * C + c]);
  if (!relu_scale) return g;
  return load_as<A>(px[r * C + c]) * relu_scale[c] + relu_shift[c] > A(0) ? g : A(0);
}

// The backward's per-channel sums over an (M, C) view, in f64: sum dy and sum dy * xhat (dy masked by the
// fused ReLU when relu_scale is set).
template <typename S, typename P>
void backward_sums(const S* px, const S* pdy, const P* pm, const P* pi, int64_t M, int64_t C,
                   const acc_t<S>* relu_scale, const acc_t<S>* relu_shift, std::vector<double>& sum_dy,
                   std::vector<double>& sum_dy_xhat) {
  using A = acc_t<S>;
  // Both sums in one pass over x and dy (each channel's additions in the same order as two passes); the
  // statistics widened to f64 once, exactly, as every product used them.
  const std::vector<double> mean_d(pm, pm + C), invstd_d(pi, pi + C);
  const std::vector<double> both = blocked_sums(M, C, 2, [&](int64_t r0, int64_t r1, double* acc) {
    if constexpr (kFastRows<S> && std::is_same_v<P, float>) {
      fast_rows_backward_sums(px, pdy, r0, r1, C, mean_d.data(), invstd_d.data(), relu_scale, relu_shift, acc);
    } else {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const double g = static_cast<double>(masked_dy_portable(px, pdy, r, c, C, relu_scale, relu_shift));
          const double xhat = (static_cast<double>(load_as<A>(px[r * C + c])) - mean_d[static_cast<size_t>(c)]) *
                              invstd_d[static_cast<size_t>(c)];
          acc[c] += g;
          acc[C + c] += g * xhat;
        }
    }
  });
  sum_dy.assign(both.begin(), both.begin() + C);
  sum_dy_xhat.assign(both.begin() + C, both.end());
}

// dx = g * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count), or g * invstd * dy without the
// statistics' terms (eval: sums null). The coefficients in f64, rounded once to the accumulator type. dy
// is masked by the fused ReLU when relu_scale is set.
template <typename S, typename P>
void backward_dx(const S* px, const S* pdy, const P* pg, const P* pm, const P* pi, const double* sum_dy,
                 const double* sum_dy_xhat, double count, int64_t M, int64_t C, const acc_t<S>* relu_scale,
                 const acc_t<S>* relu_shift, S* pdx) {
  using A = acc_t<S>;
  std::vector<A> k1(static_cast<size_t>(C)), k2(static_cast<size_t>(C)), k3(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const size_t i = static_cast<size_t>(c);
    const double gi = static_cast<double>(pg[c]) * pi[c];
    k1[i] = static_cast<A>(gi);
    k2[i] = static_cast<A>(sum_dy ? gi * sum_dy[c] / count : 0.0);
    k3[i] = static_cast<A>(sum_dy_xhat ? gi * sum_dy_xhat[c] / count : 0.0);
  }
  parallel_for(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
    if constexpr (kFastRows<S> && std::is_same_v<P, float>) {
      fast_rows_dx(px, pdy, pdx, lo, hi, C, pm, pi, k1.data(), k2.data(), k3.data(), relu_scale, relu_shift);
      return;
    }
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = static_cast<size_t>(c);
        const A xhat = (load_as<A>(px[r * C + c]) - static_cast<A>(pm[c])) * static_cast<A>(pi[c]);
        pdx[r * C + c] =
            store_as<S>(masked_dy_portable(px, pdy, r, c, C, relu_scale, relu_shift) * k1[i] - k2[i] - xhat * k3[i]);
      }
  });
}

// Both batch-norm backwards; beta set: y was relu(bn(x)) (no residual) and dy is y's gradient, masked with
// the forward's own arithmetic from x (f32, f64, and bf16 with the forward's rounding; f16 is refused).
void batch_norm_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor* beta,
                              const Tensor& save_mean, const Tensor& save_invstd, bool training, Tensor& dx,
                              Tensor& dgamma, Tensor& dbeta) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  RT_CHECK(!beta || x.dtype() == DType::F32 || x.dtype() == DType::F64 || x.dtype() == DType::BF16,
           "batch_norm_relu_backward: x is ", dtype_name(x.dtype()), "; the fused mask needs f32, f64 or bf16");
  visit_float(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using S = decltype(tag);
    using P = std::conditional_t<std::is_same_v<S, double>, double, float>;
    using A = acc_t<S>;
    const S *px = x.data<S>(), *pdy = dy.data<S>();
    const P *pm = save_mean.data<P>(), *pi = save_invstd.data<P>();
    std::vector<A> scale, shift;
    if (beta) scale_and_shift(gamma.data<P>(), beta->data<P>(), pm, pi, C, scale, shift);
    const A* ps = beta ? scale.data() : nullptr;
    const A* pt = beta ? shift.data() : nullptr;
    std::vector<double> sum_dy, sum_dy_xhat;
    backward_sums(px, pdy, pm, pi, M, C, ps, pt, sum_dy, sum_dy_xhat);
    P *pdg = dgamma.data<P>(), *pdb = dbeta.data<P>();
    for (int64_t c = 0; c < C; ++c) {
      pdg[c] = static_cast<P>(sum_dy_xhat[static_cast<size_t>(c)]);
      pdb[c] = static_cast<P>(sum_dy[static_cast<size_t>(c)]);
    }
    backward_dx(px, pdy, gamma.data<P>(), pm, pi, training ? sum_dy.data() : nullptr,
                training ? sum_dy_xhat.data() : nullptr, static_cast<double>(M), M, C, ps, pt, dx.data<S>());
  });
}

void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                         const Tensor& save_invstd, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  batch_norm_backward_impl(x, dy, gamma, nullptr, save_mean, save_invstd, training, dx, dgamma, dbeta);
}

void batch_norm_relu_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                              const Tensor& save_mean, const Tensor& save_invstd, bool training, Tensor& dx,
                              Tensor& dgamma, Tensor& dbeta) {
  batch_norm_backward_impl(x, dy, gamma, &beta, save_mean, save_invstd, training, dx, dgamma, dbeta);
}

void batch_norm_stats(const Tensor& x, Tensor& stats) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  visit_float(x.dtype(), "batch_norm_stats", [&](auto tag) {
    using S = decltype(tag);
    std::vector<double> mean, m2;
    mean_and_m2(x.data<S>(), M, C, mean, m2);
    double* out = stats.data<double>();  // [count, mean (C), M2 (C)]
    out[0] = static_cast<double>(M);
    std::copy(mean.begin(), mean.end(), out + 1);
    std::copy(m2.begin(), m2.end(), out + 1 + C);
  });
}

void batch_norm_backward_reduce(const Tensor& x, const Tensor& dy, const Tensor& save_mean, const Tensor& save_invstd,
                                Tensor& sums) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  visit_float(x.dtype(), "batch_norm_backward_reduce", [&](auto tag) {
    using S = decltype(tag);
    using P = std::conditional_t<std::is_same_v<S, double>, double, float>;
    std::vector<double> sum_dy, sum_dy_xhat;
    backward_sums(x.data<S>(), dy.data<S>(), save_mean.data<P>(), save_invstd.data<P>(), M, C, nullptr, nullptr, sum_dy,
                  sum_dy_xhat);
    double* out = sums.data<double>();  // [sum dy (C), sum dy * xhat (C)]
    std::copy(sum_dy.begin(), sum_dy.end(), out);
    std::copy(sum_dy_xhat.begin(), sum_dy_xhat.end(), out + C);
  });
}

void batch_norm_backward_elemt(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                               const Tensor& save_invstd, const Tensor& sums, double count, Tensor& dx) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  visit_float(x.dtype(), "batch_norm_backward_elemt", [&](auto tag) {
    using S = decltype(tag);
    using P = std::conditional_t<std::is_same_v<S, double>, double, float>;
    const double* ps = sums.data<double>();
    backward_dx(x.data<S>(), dy.data<S>(), gamma.data<P>(), save_mean.data<P>(), save_invstd.data<P>(), ps, ps + C,
                count, M, C, nullptr, nullptr, dx.data<S>());
  });
}

// One output row (image n, row p) of a max pool, every channel at once and without branches: the first tap
// in the window seeds the maximum, each later one replaces it where it is greater, or is NaN over a number
// (the first maximum wins; NaN propagates, as in PyTorch). The maximum is always one of the inputs, so it
// is kept in the output's own type; a window with no tap inside the image (not possible with padding at
// most half the kernel) gives -inf and no argmax.
template <typename S>
[[gnu::always_inline]] inline void max_pool_row(const S* px, const ConvGeometry& g, int64_t n, int64_t p, S* py,
                                                int64_t* pa) {
  using A = acc_t<S>;
  const int64_t C = g.c;
  for (int64_t q = 0; q < g.q; ++q) {
    S* best = py + ((n * g.p + p) * g.q + q) * C;
    int64_t* where = pa + ((n * g.p + p) * g.q + q) * C;
    bool seeded = false;
    for (int64_t r = 0; r < g.r; ++r) {
      const int64_t h = p * g.stride_h - g.pad_h + r * g.dilation_h;
      if (h < 0 || h >= g.h) continue;
      for (int64_t s = 0; s < g.s; ++s) {
        const int64_t w = q * g.stride_w - g.pad_w + s * g.dilation_w;
        if (w < 0 || w >= g.w) continue;
        const S* src = px + ((n * g.h + h) * g.w + w) * C;
        const int64_t at = h * g.w + w;
        if (!seeded) {
          for (int64_t c = 0; c < C; ++c) {
            best[c] = src[c];
            where[c] = at;
          }
          seeded = true;
          continue;
        }
        for (int64_t c = 0; c < C; ++c) {
          const A v = load_as<A>(src[c]), b = load_as<A>(best[c]);
          const bool take = (v > b) | ((v != v) & (b == b));
          if constexpr (std::is_same_v<S, BFloat16>) {  // selects as masks: a 16-bit select stayed scalar
            const uint16_t m16 = static_cast<uint16_t>(0u - static_cast<uint32_t>(take));
            const int64_t m64 = -static_cast<int64_t>(take);
            best[c].bits = static_cast<uint16_t>((src[c].bits & m16) | (best[c].bits & ~m16));
            where[c] = (at & m64) | (where[c] & ~m64);
          } else {
            best[c] = take ? src[c] : best[c];
            where[c] = take ? at : where[c];
          }
        }
      }
    }
    if (!seeded)
      for (int64_t c = 0; c < C; ++c) {
        best[c] = store_as<S>(-std::numeric_limits<A>::infinity());
        where[c] = -1;
      }
  }
}

// The f32 and bf16 rows compiled per ISA, so they run 8 to 32 channels at a time.
RT_MULTIVERSION void f32_max_pool_row(const float* px, const ConvGeometry& g, int64_t n, int64_t p, float* py,
                                      int64_t* pa) {
  max_pool_row(px, g, n, p, py, pa);
}
RT_MULTIVERSION void bf16_max_pool_row(const BFloat16* px, const ConvGeometry& g, int64_t n, int64_t p, BFloat16* py,
                                       int64_t* pa) {
  max_pool_row(px, g, n, p, py, pa);
}

void max_pool2d_forward(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax) {
  visit_float(x.dtype(), "max_pool2d", [&](auto tag) {
    using S = decltype(tag);
    const S* px = x.data<S>();
    S* py = y.data<S>();
    int64_t* pa = argmax.data<int64_t>();
    parallel_for(g.n * g.p, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t np = lo; np < hi; ++np) {
        if constexpr (std::is_same_v<S, float>) {
          f32_max_pool_row(px, g, np / g.p, np % g.p, py, pa);
        } else if constexpr (std::is_same_v<S, BFloat16>) {
          bf16_max_pool_row(px, g, np / g.p, np % g.p, py, pa);
        } else {
          max_pool_row(px, g, np / g.p, np % g.p, py, pa);
        }
      }
    });
  });
}

void max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const ConvGeometry& g, Tensor& dx) {
  visit_float(dy.dtype(), "max_pool2d_backward", [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    const S* pdy = dy.data<S>();
    const int64_t* pa = argmax.data<int64_t>();
    S* pdx = dx.data<S>();
    // One image per task: overlapping windows only scatter within their own image.
    parallel_for(g.n, 1, [&](int64_t lo, int64_t hi) {
      std::vector<A> acc(static_cast<size_t>(g.h * g.w * g.c));
      for (int64_t n = lo; n < hi; ++n) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t i = 0; i < g.p * g.q; ++i)
          for (int64_t c = 0; c < g.c; ++c) {
            const int64_t o = (n * g.p * g.q + i) * g.c + c;
            if (pa[o] >= 0) acc[static_cast<size_t>(pa[o] * g.c + c)] += load_as<A>(pdy[o]);
          }
        S* dst = pdx + n * g.h * g.w * g.c;
        if constexpr (std::is_same_v<S, BFloat16>) {
          for (size_t i = 0; i < acc.size(); ++i) dst[i] = to_bf16_flat(acc[i]);  // store_as's bits, no branch
        } else {
          for (size_t i = 0; i < acc.size(); ++i) dst[i] = store_as<S>(acc[i]);
        }
      }
    });
  });
}

void avg_pool2d_forward(const Tensor& x, const ConvGeometry& g, Tensor& y) {
  visit_float(x.dtype(), "avg_pool2d", [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    const S* px = x.data<S>();
    S* py = y.data<S>();
    const A inv = A(1) / static_cast<A>(g.r * g.s);
    parallel_for(g.n * g.p, 1, [&](int64_t lo, int64_t hi) {
      std::vector<A> acc(static_cast<size_t>(g.c));
      for (int64_t np = lo; np < hi; ++np) {
        const int64_t n = np / g.p, p = np % g.p;
        for (int64_t q = 0; q < g.q; ++q) {
          std::fill(acc.begin(), acc.end(), A(0));
          for (int64_t r = 0; r < g.r; ++r) {
            const int64_t h = p * g.stride_h - g.pad_h + r;
            if (h < 0 || h >= g.h) continue;
            for (int64_t s = 0; s < g.s; ++s) {
              const int64_t w = q * g.stride_w - g.pad_w + s;
              if (w < 0 || w >= g.w) continue;
              const S* src = px + ((n * g.h + h) * g.w + w) * g.c;
              for (int64_t c = 0; c < g.c; ++c) acc[static_cast<size_t>(c)] += load_as<A>(src[c]);
            }
          }
          S* dst = py + ((n * g.p + p) * g.q + q) * g.c;
          for (int64_t c = 0; c < g.c; ++c) dst[c] = store_as<S>(acc[static_cast<size_t>(c)] * inv);
        }
      }
    });
  });
}

void avg_pool2d_backward(const Tensor& dy, const ConvGeometry& g, Tensor& dx) {
  visit_float(dy.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    const S* pdy = dy.data<S>();
    S* pdx = dx.data<S>();
    const A inv = A(1) / static_cast<A>(g.r * g.s);
    parallel_for(g.n, 1, [&](int64_t lo, int64_t hi) {
      std::vector<A> acc(static_cast<size_t>(g.h * g.w * g.c));
      for (int64_t n = lo; n < hi; ++n) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t p = 0; p < g.p; ++p)
          for (int64_t q = 0; q < g.q; ++q) {
            const S* src = pdy + ((n * g.p + p) * g.q + q) * g.c;
            for (int64_t r = 0; r < g.r; ++r) {
              const int64_t h = p * g.stride_h - g.pad_h + r;
              if (h < 0 || h >= g.h) continue;
              for (int64_t s = 0; s < g.s; ++s) {
                const int64_t w = q * g.stride_w - g.pad_w + s;
                if (w < 0 || w >= g.w) continue;
                A* dst = acc.data() + (h * g.w + w) * g.c;
                for (int64_t c = 0; c < g.c; ++c) dst[c] += load_as<A>(src[c]) * inv;
              }
            }
          }
        S* out = pdx + n * g.h * g.w * g.c;
        for (size_t i = 0; i < acc.size(); ++i) out[i] = store_as<S>(acc[i]);
      }
    });
  });
}

}  // namespace

void register_norm_pool_kernels(KernelTable& t) {
  t.batch_norm_forward = &batch_norm_forward;
  t.batch_norm_backward = &batch_norm_backward;
  t.batch_norm_relu_backward = &batch_norm_relu_backward;
  t.batch_norm_stats = &batch_norm_stats;
  t.batch_norm_apply = &batch_norm_apply;
  t.batch_norm_backward_reduce = &batch_norm_backward_reduce;
  t.batch_norm_backward_elemt = &batch_norm_backward_elemt;
  t.max_pool2d_forward = &max_pool2d_forward;
  t.max_pool2d_backward = &max_pool2d_backward;
  t.avg_pool2d_forward = &avg_pool2d_forward;
  t.avg_pool2d_backward = &avg_pool2d_backward;
}

}  // namespace ringtrain::cpu
