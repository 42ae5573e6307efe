// core/cpu/activation.cpp: the activations of today's CNNs (ActivationOp: clamp, hardtanh/ReLU6, leaky ReLU,
// GELU and its tanh form, SiLU, hardswish, hardsigmoid), forward and backward from x. f64 computes with the C
// library's exp, erfc and friends (the gradient checks' reference); f32, bf16 and f16 compute in f32 with the
// branch-free exp and erfc below, whose loops vectorize (compiled for AVX-512, AVX2 and baseline x86-64 and
// picked at load time; built with -ffp-contract=off so that every clone rounds as the portable loop does and
// each CPU gives the same bits). exp_f32 is within 2e-7 relative; erfc_f32 within 2e-6 relative for arguments
// up to 4 (GELU down to x = -5.7, where it is -3e-7), growing to 8e-6 at 8.5 (the f32 rounding of -z^2).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

// ---------------------------------------------------------------------------------------------------
// Branch-free f32 math

[[gnu::always_inline]] inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// e^x: x = k ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so k ln 2 is exact; k rounded to nearest by
// adding and taking away 1.5 * 2^23, which SSE2 vectorizes as it would not floor), e^r by its Taylor series to
// r^7 (truncation below 6e-9 relative), times 2^k built in the exponent bits (k at most 127). 0 below -87.3
// (where e^x leaves the normal floats), infinity above 88.72 (where it overflows).
[[gnu::always_inline]] inline float exp_f32(float x) {
  const float clamped = x > 88.3f ? 88.3f : (x < -87.3f ? -87.3f : x);
  const float k = (clamped * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (clamped - k * 0.693145752f) - k * 1.42860677e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = bits_to_float(static_cast<uint32_t>(static_cast<int32_t>(k) + 127) << 23);
  const float e = p * scale;
  const float overflowed = x > 88.72f ? std::numeric_limits<float>::infinity() : e;
  return x < -87.3f ? 0.0f : overflowed;  // x itself: NaN stays NaN through the comparisons' false
}

// erfc(z) for z >= 0 as t e^(-z^2 + Q(t)), t = 1 / (1 + z / 2), Q a degree-9 polynomial fitted to
// log(erfc(z) / t) + z^2 over z in [0, 9] (2e-7 relative in exact arithmetic).
[[gnu::always_inline]] inline float erfc_nonneg_f32(float z) {
  const float t = 1.0f / (1.0f + 0.5f * z);
  float q = 1.611252970e-01f;
  q = q * t - 7.609855880e-01f;
  q = q * t + 1.326285028e+00f;
  q = q * t - 8.963834086e-01f;
  q = q * t + 6.410299567e-02f;
  q = q * t - 6.426014624e-02f;
  q = q * t + 5.313355378e-02f;
  q = q * t + 3.835317543e-01f;
  q = q * t + 9.989082244e-01f;
  q = q * t - 1.265457495e+00f;
  return t * exp_f32(q - z * z);
}

// The standard normal CDF Phi(x) = erfc(-x / sqrt 2) / 2, from erfc of |x| / sqrt 2 on either side (never
// 1 - erf, which loses the small values of the left tail).
[[gnu::always_inline]] inline float normal_cdf_f32(float x) {
  const float z = x * 0.707106781f;
  const float half = 0.5f * erfc_nonneg_f32(std::fabs(z));
  return z < 0.0f ? half : 1.0f - half;
}

// ---------------------------------------------------------------------------------------------------
// The activations in the compute type C (float: the functions above; double: the C library)

constexpr double kSqrt2OverPi = 0.7978845608028654, kGeluTanhCubic = 0.044715, kInvSqrt2Pi = 0.3989422804014327;

template <typename C>
[[gnu::always_inline]] inline C exp_c(C x) {
  if constexpr (std::is_same_v<C, double>)
    return std::exp(x);
  else
    return exp_f32(x);
}
template <typename C>
[[gnu::always_inline]] inline C normal_cdf_c(C x) {
  if constexpr (std::is_same_v<C, double>)
    return 0.5 * std::erfc(-x * 0.7071067811865476);
  else
    return normal_cdf_f32(x);
}
template <typename C>
[[gnu::always_inline]] inline C sigmoid_c(C x) {
  return C(1) / (C(1) + exp_c<C>(-x));
}

template <ActivationOp OP, typename C>
[[gnu::always_inline]] inline C activate(C x, C a, C b) {
  if constexpr (OP == ActivationOp::Clamp || OP == ActivationOp::Hardtanh) {
    return x < a ? a : (x > b ? b : x);  // NaN passes through, as PyTorch's
  } else if constexpr (OP == ActivationOp::LeakyRelu) {
    return x > C(0) ? x : x * a;
  } else if constexpr (OP == ActivationOp::Gelu) {
    return x * normal_cdf_c<C>(x);
  } else if constexpr (OP == ActivationOp::GeluTanh) {
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u): no cancellation for small u.
    const C u = C(kSqrt2OverPi) * (x + C(kGeluTanhCubic) * x * x * x);
    return x * sigmoid_c<C>(C(2) * u);
  } else if constexpr (OP == ActivationOp::Silu) {
    return x / (C(1) + exp_c<C>(-x));
  } else if constexpr (OP == ActivationOp::Hardswish) {
    const C r = x + C(3);
    return x * (r < C(0) ? C(0) : (r > C(6) ? C(6) : r)) / C(6);
  } else {  // Hardsigmoid
    const C r = x + C(3);
    return (r < C(0) ? C(0) : (r > C(6) ? C(6) : r)) / C(6);
  }
}

// dx = dy * f'(x), each with PyTorch 2.15's edges (what the gradient is at a bound itself).
template <ActivationOp OP, typename C>
[[gnu::always_inline]] inline C activate_grad(C x, C dy, C a, C b) {
  if constexpr (OP == ActivationOp::Clamp) {
    return (x > a && x < b) ? dy : C(0);  // PyTorch 2's: nothing at the bounds themselves, nor for NaN
  } else if constexpr (OP == ActivationOp::Hardtanh) {
    return (x <= a || x >= b) ? C(0) : dy;
  } else if constexpr (OP == ActivationOp::LeakyRelu) {
    return x > C(0) ? dy : dy * a;
  } else if constexpr (OP == ActivationOp::Gelu) {
    const C pdf = C(kInvSqrt2Pi) * exp_c<C>(C(-0.5) * x * x);
    return dy * (normal_cdf_c<C>(x) + x * pdf);
  } else if constexpr (OP == ActivationOp::GeluTanh) {
    const C x2 = x * x;
    const C u = C(kSqrt2OverPi) * (x + C(kGeluTanhCubic) * x2 * x);
    const C s = sigmoid_c<C>(C(2) * u);
    const C du = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluTanhCubic) * x2);
    return dy * (s + x * C(2) * s * (C(1) - s) * du);
  } else if constexpr (OP == ActivationOp::Silu) {
    const C s = sigmoid_c<C>(x);
    return dy * s * (C(1) + x * (C(1) - s));
  } else if constexpr (OP == ActivationOp::Hardswish) {
    return x <= C(-3) ? C(0) : (x < C(3) ? dy * (x / C(3) + C(0.5)) : dy);
  } else {  // Hardsigmoid
    return (x > C(-3) && x < C(3)) ? dy / C(6) : C(0);
  }
}

// ---------------------------------------------------------------------------------------------------
// Loops: f32 and bf16 in vectorized clones per op, every other dtype through the portable template.

using bf16 = BFloat16;

#define RT_ACTIVATION_LOOPS(NAME, OP)                                                                             \
  RT_MULTIVERSION void NAME##_f32(const float* x, float* y, int64_t n, float a, float b) {                        \
    for (int64_t i = 0; i < n; ++i) y[i] = activate<OP, float>(x[i], a, b);                                       \
  }                                                                                                               \
  RT_MULTIVERSION void NAME##_bf16(const bf16* x, bf16* y, int64_t n, float a, float b) {                         \
    for (int64_t i = 0; i < n; ++i) y[i] = to_bf16_flat(activate<OP, float>(bf16_to_f32(x[i]), a, b));            \
  }                                                                                                               \
  RT_MULTIVERSION void NAME##_grad_f32(const float* x, const float* dy, float* dx, int64_t n, float a, float b) { \
    for (int64_t i = 0; i < n; ++i) dx[i] = activate_grad<OP, float>(x[i], dy[i], a, b);                          \
  }                                                                                                               \
  RT_MULTIVERSION void NAME##_grad_bf16(const bf16* x, const bf16* dy, bf16* dx, int64_t n, float a, float b) {   \
    for (int64_t i = 0; i < n; ++i)                                                                               \
      dx[i] = to_bf16_flat(activate_grad<OP, float>(bf16_to_f32(x[i]), bf16_to_f32(dy[i]), a, b));                \
  }

RT_ACTIVATION_LOOPS(clamp, ActivationOp::Clamp)
RT_ACTIVATION_LOOPS(hardtanh, ActivationOp::Hardtanh)
RT_ACTIVATION_LOOPS(leaky_relu, ActivationOp::LeakyRelu)
RT_ACTIVATION_LOOPS(gelu, ActivationOp::Gelu)
RT_ACTIVATION_LOOPS(gelu_tanh, ActivationOp::GeluTanh)
RT_ACTIVATION_LOOPS(silu, ActivationOp::Silu)
RT_ACTIVATION_LOOPS(hardswish, ActivationOp::Hardswish)
RT_ACTIVATION_LOOPS(hardsigmoid, ActivationOp::Hardsigmoid)
#undef RT_ACTIVATION_LOOPS

struct Loops {
  void (*forward_f32)(const float*, float*, int64_t, float, float);
  void (*forward_bf16)(const bf16*, bf16*, int64_t, float, float);
  void (*backward_f32)(const float*, const float*, float*, int64_t, float, float);
  void (*backward_bf16)(const bf16*, const bf16*, bf16*, int64_t, float, float);
};

Loops loops_of(ActivationOp op) {
  switch (op) {
    case ActivationOp::Clamp:
      return {clamp_f32, clamp_bf16, clamp_grad_f32, clamp_grad_bf16};
    case ActivationOp::Hardtanh:
      return {hardtanh_f32, hardtanh_bf16, hardtanh_grad_f32, hardtanh_grad_bf16};
    case ActivationOp::LeakyRelu:
      return {leaky_relu_f32, leaky_relu_bf16, leaky_relu_grad_f32, leaky_relu_grad_bf16};
    case ActivationOp::Gelu:
      return {gelu_f32, gelu_bf16, gelu_grad_f32, gelu_grad_bf16};
    case ActivationOp::GeluTanh:
      return {gelu_tanh_f32, gelu_tanh_bf16, gelu_tanh_grad_f32, gelu_tanh_grad_bf16};
    case ActivationOp::Silu:
      return {silu_f32, silu_bf16, silu_grad_f32, silu_grad_bf16};
    case ActivationOp::Hardswish:
      return {hardswish_f32, hardswish_bf16, hardswish_grad_f32, hardswish_grad_bf16};
    case ActivationOp::Hardsigmoid:
      return {hardsigmoid_f32, hardsigmoid_bf16, hardsigmoid_grad_f32, hardsigmoid_grad_bf16};
  }
  RT_THROW("activation: unknown op ", static_cast<int>(op));
}

void activation(ActivationOp op, const Tensor& x, double a, double b, Tensor& y) {
  const int64_t n = x.numel();
  const auto fa = static_cast<float>(a), fb = static_cast<float>(b);
  if (x.dtype() == DType::F32) {
    const Loops l = loops_of(op);
    const float* px = x.data<float>();
    float* py = y.data<float>();
    parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) { l.forward_f32(px + lo, py + lo, hi - lo, fa, fb); });
    return;
  }
  if (x.dtype() == DType::BF16) {
    const Loops l = loops_of(op);
    const bf16* px = x.data<bf16>();
    bf16* py = y.data<bf16>();
    parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) { l.forward_bf16(px + lo, py + lo, hi - lo, fa, fb); });
    return;
  }
  visit_floating(x.dtype(), "activation", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* px = x.data<S>();
    S* py = y.data<S>();
    with_activation_op(op, [&](auto op_tag) {
      constexpr ActivationOp O = decltype(op_tag)::value;
      parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i)
          py[i] = store_as<S>(activate<O, C>(load_as<C>(px[i]), static_cast<C>(a), static_cast<C>(b)));
      });
    });
  });
}

void activation_backward(ActivationOp op, const Tensor& x, const Tensor& dy, double a, double b, Tensor& dx) {
  const int64_t n = x.numel();
  RT_CHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype() && dy.numel() == n && dx.numel() == n,
           "activation_backward: ", x.describe(), ", ", dy.describe(), " and ", dx.describe(), " do not match");
  const auto fa = static_cast<float>(a), fb = static_cast<float>(b);
  if (x.dtype() == DType::F32) {
    const Loops l = loops_of(op);
    const float *px = x.data<float>(), *pg = dy.data<float>();
    float* pd = dx.data<float>();
    parallel_for(n, kGrain,
                 [&](int64_t lo, int64_t hi) { l.backward_f32(px + lo, pg + lo, pd + lo, hi - lo, fa, fb); });
    return;
  }
  if (x.dtype() == DType::BF16) {
    const Loops l = loops_of(op);
    const bf16 *px = x.data<bf16>(), *pg = dy.data<bf16>();
    bf16* pd = dx.data<bf16>();
    parallel_for(n, kGrain,
                 [&](int64_t lo, int64_t hi) { l.backward_bf16(px + lo, pg + lo, pd + lo, hi - lo, fa, fb); });
    return;
  }
  visit_floating(x.dtype(), "activation_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S *px = x.data<S>(), *pg = dy.data<S>();
    S* pd = dx.data<S>();
    with_activation_op(op, [&](auto op_tag) {
      constexpr ActivationOp O = decltype(op_tag)::value;
      parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i)
          pd[i] = store_as<S>(
              activate_grad<O, C>(load_as<C>(px[i]), load_as<C>(pg[i]), static_cast<C>(a), static_cast<C>(b)));
      });
    });
  });
}

}  // namespace

void register_activation_kernels(KernelTable& t) {
  t.activation = &activation;
  t.activation_backward = &activation_backward;
}

}  // namespace ringtrain::cpu
