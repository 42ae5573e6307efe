// core/cuda/activation.cu: the activations (ActivationOp), forward and backward from x, one grid-stride kernel
// each with the op a template parameter. The formulas and edges are the CPU's (core/cpu/activation.cpp) in the
// compute type (f32 for 16-bit storage) with CUDA's own expf / erfcf (within 2 ulp), so the two devices agree to
// a few f32 roundings, not bit for bit.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/cuda/common.cuh"
#include "core/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "core/kernels.h"
#include "core/tensor.h"

namespace ringtrain::cuda {
namespace {

using namespace cuda_common;

constexpr double kSqrt2OverPi = 0.7978845608028654, kGeluTanhCubic = 0.044715, kInvSqrt2Pi = 0.3989422804014327,
                 kInvSqrt2 = 0.7071067811865476;

__device__ inline float dev_erfc(float x) { return erfcf(x); }
__device__ inline double dev_erfc(double x) { return erfc(x); }

template <typename C>
__device__ inline C normal_cdf(C x) {
  return C(0.5) * dev_erfc(-x * C(kInvSqrt2));
}
template <typename C>
__device__ inline C sigmoid(C x) {
  return C(1) / (C(1) + dev_exp(-x));
}

template <ActivationOp OP, typename C>
__device__ inline C activate(C x, C a, C b) {
  if constexpr (OP == ActivationOp::Clamp || OP == ActivationOp::Hardtanh) {
    return x < a ? a : (x > b ? b : x);
  } else if constexpr (OP == ActivationOp::LeakyRelu) {
    return x > C(0) ? x : x * a;
  } else if constexpr (OP == ActivationOp::Gelu) {
    return x * normal_cdf<C>(x);
  } else if constexpr (OP == ActivationOp::GeluTanh) {
    const C u = C(kSqrt2OverPi) * (x + C(kGeluTanhCubic) * x * x * x);
    return x * sigmoid<C>(C(2) * u);
  } else if constexpr (OP == ActivationOp::Silu) {
    return x / (C(1) + dev_exp(-x));
  } else if constexpr (OP == ActivationOp::Hardswish) {
    const C r = x + C(3);
    return x * (r < C(0) ? C(0) : (r > C(6) ? C(6) : r)) / C(6);
  } else {
    const C r = x + C(3);
    return (r < C(0) ? C(0) : (r > C(6) ? C(6) : r)) / C(6);
  }
}

template <ActivationOp OP, typename C>
__device__ inline C activate_grad(C x, C dy, C a, C b) {
  if constexpr (OP == ActivationOp::Clamp) {
    return (x > a && x < b) ? dy : C(0);
  } else if constexpr (OP == ActivationOp::Hardtanh) {
    return (x <= a || x >= b) ? C(0) : dy;
  } else if constexpr (OP == ActivationOp::LeakyRelu) {
    return x > C(0) ? dy : dy * a;
  } else if constexpr (OP == ActivationOp::Gelu) {
    const C pdf = C(kInvSqrt2Pi) * dev_exp(C(-0.5) * x * x);
    return dy * (normal_cdf<C>(x) + x * pdf);
  } else if constexpr (OP == ActivationOp::GeluTanh) {
    const C x2 = x * x;
    const C u = C(kSqrt2OverPi) * (x + C(kGeluTanhCubic) * x2 * x);
    const C s = sigmoid<C>(C(2) * u);
    const C du = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluTanhCubic) * x2);
    return dy * (s + x * C(2) * s * (C(1) - s) * du);
  } else if constexpr (OP == ActivationOp::Silu) {
    const C s = sigmoid<C>(x);
    return dy * s * (C(1) + x * (C(1) - s));
  } else if constexpr (OP == ActivationOp::Hardswish) {
    return x <= C(-3) ? C(0) : (x < C(3) ? dy * (x / C(3) + C(0.5)) : dy);
  } else {
    return (x > C(-3) && x < C(3)) ? dy / C(6) : C(0);
  }
}

template <ActivationOp OP, typename S>
__global__ void activation_kernel(const S* x, S* y, int64_t n, compute_t<S> a, compute_t<S> b) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, n) y[i] = store_as<S>(activate<OP, C>(load_as<C>(x[i]), a, b));
}

template <ActivationOp OP, typename S>
__global__ void activation_backward_kernel(const S* x, const S* dy, S* dx, int64_t n, compute_t<S> a, compute_t<S> b) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, n) dx[i] = store_as<S>(activate_grad<OP, C>(load_as<C>(x[i]), load_as<C>(dy[i]), a, b));
}

void activation(ActivationOp op, const Tensor& x, double a, double b, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceScope scope(y);
  dispatch_floating(x.dtype(), "activation", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    with_activation_op(op, [&](auto op_tag) {
      constexpr ActivationOp O = decltype(op_tag)::value;
      activation_kernel<O, S><<<grid_for(n), kThreads, 0, stream_now()>>>(x.data<S>(), y.data<S>(), n,
                                                                          static_cast<C>(a), static_cast<C>(b));
    });
  });
}

void activation_backward(ActivationOp op, const Tensor& x, const Tensor& dy, double a, double b, Tensor& dx) {
  const int64_t n = x.numel();
  RT_CHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype() && dy.numel() == n && dx.numel() == n,
           "activation_backward: ", x.describe(), ", ", dy.describe(), " and ", dx.describe(), " do not match");
  if (n == 0) return;
  DeviceScope scope(dx);
  dispatch_floating(x.dtype(), "activation_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    with_activation_op(op, [&](auto op_tag) {
      constexpr ActivationOp O = decltype(op_tag)::value;
      activation_backward_kernel<O, S><<<grid_for(n), kThreads, 0, stream_now()>>>(
          x.data<S>(), dy.data<S>(), dx.data<S>(), n, static_cast<C>(a), static_cast<C>(b));
    });
  });
}

}  // namespace

void register_activation_kernels(KernelTable& t) {
  t.activation = &activation;
  t.activation_backward = &activation_backward;
}

}  // namespace ringtrain::cuda
