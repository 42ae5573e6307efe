// core/cpu/resample.cpp: separable resampling of NHWC images through per-row and per-column tap tables
// (core/kernels.h ResampleTaps): adaptive average pooling, nearest and bilinear upsampling, and -- with the
// transposed tables -- their backward, gathers without atomics. Each task is one output row of one image; its
// pixels accumulate over the C channels (contiguous in NHWC, so the loops vectorize) as
// sum_i sum_j (weight_h[i] * weight_w[j]) * x, rows outer, columns inner, in the compute type.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

void resample2d(const Tensor& x, const ResampleTaps& taps, Tensor& y) {
  const int64_t n = x.size(0), h = x.size(1), w = x.size(2), c = x.size(3);
  const int64_t p = y.size(1), q = y.size(2);
  RT_CHECK(y.size(0) == n && y.size(3) == c && taps.offsets_h.numel() == p + 1 && taps.offsets_w.numel() == q + 1,
           "resample2d: ", x.describe(), " -> ", y.describe(), " with tables for ", taps.offsets_h.numel() - 1, " x ",
           taps.offsets_w.numel() - 1, " outputs");
  const int32_t *oh = taps.offsets_h.data<int32_t>(), *ih = taps.index_h.data<int32_t>();
  const int32_t *ow = taps.offsets_w.data<int32_t>(), *iw = taps.index_w.data<int32_t>();
  visit_floating(x.dtype(), "resample2d", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    using Wt = std::conditional_t<std::is_same_v<S, double>, double, float>;
    const Wt *wh = taps.weight_h.data<Wt>(), *ww = taps.weight_w.data<Wt>();
    const S* px = x.data<S>();
    S* py = y.data<S>();
    const int64_t per_task = std::max<int64_t>(1, q * c * 2);
    parallel_for(n * p, std::max<int64_t>(1, kGrain / per_task), [&](int64_t lo, int64_t hi) {
      std::vector<C> acc(static_cast<size_t>(c));
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t img = t / p, row = t % p;
        const S* xi = px + img * h * w * c;
        for (int64_t col = 0; col < q; ++col) {
          std::fill(acc.begin(), acc.end(), C(0));
          for (int32_t a = oh[row]; a < oh[row + 1]; ++a) {
            const S* xr = xi + static_cast<int64_t>(ih[a]) * w * c;
            const C weight_row = static_cast<C>(wh[a]);
            for (int32_t b = ow[col]; b < ow[col + 1]; ++b) {
              const C weight = weight_row * static_cast<C>(ww[b]);
              const S* xp = xr + static_cast<int64_t>(iw[b]) * c;
              for (int64_t k = 0; k < c; ++k) acc[static_cast<size_t>(k)] += weight * load_as<C>(xp[k]);
            }
          }
          S* out = py + ((img * p + row) * q + col) * c;
          for (int64_t k = 0; k < c; ++k) out[k] = store_as<S>(acc[static_cast<size_t>(k)]);
        }
      }
    });
  });
}

}  // namespace

void register_resample_kernels(KernelTable& t) { t.resample2d = &resample2d; }

}  // namespace ringtrain::cpu
