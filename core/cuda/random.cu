// core/cuda/random.cu: the CUDA random kernels: uniform, normal and dropout, each element a pure function
// of (seed, stream, index) through Philox (core/philox.h), written operation for operation like the CPU
// kernels (core/cpu/random.cpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/cuda/common.cuh"
#include "core/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "core/kernels.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace ringtrain::cuda {
namespace {

// Launch helpers, dtype dispatch and device math: core/cuda/common.cuh.
using namespace cuda_common;

// ---------------------------------------------------------------------------------------------------
// Random: a pure function of (seed, stream, i), written operation for operation like the CPU kernels.
// The explicitly rounded intrinsics (__dmul_rn, __fadd_rn, ...) are never contracted into FMAs, which
// the CPU (baseline x86-64) does not use either; uniform values are then bit-identical to the CPU, and
// normal values differ only where CUDA's log / cos / sqrt round differently from the host libm.

template <typename S>
__global__ void uniform_kernel(S* out /* (n) */, int64_t n, uint64_t seed, uint64_t stream, double low,
                               double span /* high - low */) {
  RT_GRID_STRIDE(i, n) {
    const uint64_t index = static_cast<uint64_t>(i);
    // philox gives (0, 1]; 1 - u is in [0, 1), so the range is [low, high). 1 - u is exact.
    if constexpr (std::is_same_v<S, double>) {
      out[i] = __dadd_rn(low, __dmul_rn(span, 1.0 - philox_uniform_f64(seed, stream, index)));
    } else {
      const float u = 1.0f - philox_uniform(seed, stream, index);
      out[i] = store_as<S>(__double2float_rn(__dadd_rn(low, __dmul_rn(span, static_cast<double>(u)))));
    }
  }
}

// mean + std * sqrt(-2 ln u1) * cos(2 pi u2): f64 throughout for f64; otherwise z in f32 and the affine
// part in f64, as on the CPU.
template <typename S>
__global__ void normal_kernel(S* out /* (n) */, int64_t n, uint64_t seed, uint64_t stream, double mean, double stddev) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  RT_GRID_STRIDE(i, n) {
    const uint64_t j = 2 * static_cast<uint64_t>(i);
    if constexpr (std::is_same_v<S, double>) {
      const double u1 = philox_uniform_f64(seed, stream, j), u2 = philox_uniform_f64(seed, stream, j + 1);
      const double radius = sqrt(__dmul_rn(-2.0, log(u1)));
      out[i] = __dadd_rn(mean, __dmul_rn(__dmul_rn(stddev, radius), cos(__dmul_rn(kTwoPi, u2))));
    } else {
      const float u1 = philox_uniform(seed, stream, j), u2 = philox_uniform(seed, stream, j + 1);
      const float z = __fmul_rn(sqrtf(__fmul_rn(-2.0f, logf(u1))), cosf(__fmul_rn(static_cast<float>(kTwoPi), u2)));
      out[i] = store_as<S>(__double2float_rn(__dadd_rn(mean, __dmul_rn(stddev, static_cast<double>(z)))));
    }
  }
}

void uniform(Tensor& out, uint64_t seed, uint64_t stream, double low, double high) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_floating(out.dtype(), "uniform", [&](auto tag) {
    using S = typename decltype(tag)::type;
    uniform_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(out.data<S>(), n, seed, stream, low, high - low);
  });
}

void normal(Tensor& out, uint64_t seed, uint64_t stream, double mean, double stddev) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_floating(out.dtype(), "normal", [&](auto tag) {
    using S = typename decltype(tag)::type;
    normal_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(out.data<S>(), n, seed, stream, mean, stddev);
  });
}

// ---------------------------------------------------------------------------------------------------
// dropout, as the CPU: keep when u_i > p (compared in f32), m = keep ? 1/(1-p) : 0 in the compute type;
// mask = m stored in x's dtype, out = x * m (m unrounded).

template <typename S>
__global__ void dropout_kernel(const S* x /* (n) */, float threshold, compute_t<S> keep_scale, uint64_t seed,
                               uint64_t stream, int64_t first, S* out /* (n) */, S* mask /* (n) */, int64_t n) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, n) {
    const C m = philox_uniform(seed, stream, static_cast<uint64_t>(first + i)) > threshold ? keep_scale : C(0);
    mask[i] = store_as<S>(m);
    out[i] = store_as<S>(load_as<C>(x[i]) * m);
  }
}

void dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, int64_t first, Tensor& out, Tensor& mask) {
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using S = typename decltype(tag)::type;
    const compute_t<S> keep_scale = static_cast<compute_t<S>>(1.0 / (1.0 - p));
    dropout_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(x.data<S>(), static_cast<float>(p), keep_scale, seed,
                                                                  stream, first, out.data<S>(), mask.data<S>(), n);
  });
}

// drop_path's per-sample mask, as the CPU: element i drawn at index first + i, kept when u > p (in f32).
template <typename S>
__global__ void sample_mask_kernel(S* mask /* (n) */, float threshold, compute_t<S> keep_scale, uint64_t seed,
                                   uint64_t stream, int64_t first, int64_t n) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, n) {
    mask[i] =
        store_as<S>(philox_uniform(seed, stream, static_cast<uint64_t>(first + i)) > threshold ? keep_scale : C(0));
  }
}

void sample_mask(Tensor& mask, double p, uint64_t seed, uint64_t stream, int64_t first) {
  const int64_t n = mask.numel();
  if (n == 0) return;
  DeviceScope scope(mask);
  dispatch_floating(mask.dtype(), "sample_mask", [&](auto tag) {
    using S = typename decltype(tag)::type;
    const compute_t<S> keep_scale = static_cast<compute_t<S>>(1.0 / (1.0 - p));
    sample_mask_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(mask.data<S>(), static_cast<float>(p), keep_scale,
                                                                      seed, stream, first, n);
  });
}

}  // namespace

void register_random_kernels(KernelTable& t) {
  t.uniform = &uniform;
  t.normal = &normal;
  t.dropout = &dropout;
  t.sample_mask = &sample_mask;
}

}  // namespace ringtrain::cuda
