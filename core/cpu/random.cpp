// core/cpu/random.cpp: the CPU random kernels: uniform, normal and dropout. Each element is a pure
// function of (seed, stream, index) through Philox (core/philox.h), so results never depend on the
// thread count; the CUDA kernels (core/cuda/random.cu) follow these operation for operation.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"
#include "core/philox.h"

namespace ringtrain::cpu {
namespace {

void uniform(Tensor& out, uint64_t seed, uint64_t stream, double low, double high) {
  visit_floating(out.dtype(), "uniform", [&](auto tag) {
    using S = typename decltype(tag)::type;
    S* p = out.data<S>();
    parallel_for(out.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        // philox gives (0, 1]; 1 - u is in [0, 1) so the range is [low, high).
        if constexpr (std::is_same_v<S, double>) {
          p[i] = low + (high - low) * (1.0 - philox_uniform_f64(seed, stream, static_cast<uint64_t>(i)));
        } else {
          float u = 1.0f - philox_uniform(seed, stream, static_cast<uint64_t>(i));
          p[i] = store_as<S>(static_cast<float>(low + (high - low) * static_cast<double>(u)));
        }
      }
    });
  });
}

void normal(Tensor& out, uint64_t seed, uint64_t stream, double mean, double stddev) {
  visit_floating(out.dtype(), "normal", [&](auto tag) {
    using S = typename decltype(tag)::type;
    S* p = out.data<S>();
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    parallel_for(out.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const uint64_t j = 2 * static_cast<uint64_t>(i);
        if constexpr (std::is_same_v<S, double>) {
          double u1 = philox_uniform_f64(seed, stream, j), u2 = philox_uniform_f64(seed, stream, j + 1);
          p[i] = mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
        } else {
          float u1 = philox_uniform(seed, stream, j), u2 = philox_uniform(seed, stream, j + 1);
          float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(static_cast<float>(kTwoPi) * u2);
          p[i] = store_as<S>(static_cast<float>(mean + stddev * static_cast<double>(z)));
        }
      }
    });
  });
}

void dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, int64_t first, Tensor& out, Tensor& mask) {
  visit_floating(x.dtype(), "dropout", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* px = x.data<S>();
    S *po = out.data<S>(), *pm = mask.data<S>();
    const C keep_scale = static_cast<C>(1.0 / (1.0 - p));
    const float threshold = static_cast<float>(p);
    parallel_for(x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const C m = philox_uniform(seed, stream, static_cast<uint64_t>(first + i)) > threshold ? keep_scale : C(0);
        pm[i] = store_as<S>(m);
        po[i] = store_as<S>(load_as<C>(px[i]) * m);
      }
    });
  });
}

// drop_path's per-sample mask: as dropout's mask, element i drawn at index first + i.
void sample_mask(Tensor& mask, double p, uint64_t seed, uint64_t stream, int64_t first) {
  visit_floating(mask.dtype(), "sample_mask", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    S* pm = mask.data<S>();
    const C keep_scale = static_cast<C>(1.0 / (1.0 - p));
    const float threshold = static_cast<float>(p);
    for (int64_t i = 0; i < mask.numel(); ++i)
      pm[i] =
          store_as<S>(philox_uniform(seed, stream, static_cast<uint64_t>(first + i)) > threshold ? keep_scale : C(0));
  });
}

}  // namespace

void register_random_kernels(KernelTable& t) {
  t.uniform = &uniform;
  t.normal = &normal;
  t.dropout = &dropout;
  t.sample_mask = &sample_mask;
}

}  // namespace ringtrain::cpu
