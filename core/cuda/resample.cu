// core/cuda/resample.cu: separable resampling of NHWC images through the tap tables (core/kernels.h
// ResampleTaps): adaptive average pooling, nearest and bilinear upsampling and, with the transposed tables,
// their backward as gathers (no atomics). One thread per output element, channels innermost so neighbouring
// threads read neighbouring channels; the sum runs as the CPU's (core/cpu/resample.cpp): rows outer, columns
// inner, each term weighted by weight_h * weight_w in the compute type.
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

template <typename S, typename W>
__global__ void resample2d_kernel(const S* x, int64_t h, int64_t w, int64_t c, const int32_t* oh, const int32_t* ih,
                                  const W* wh, const int32_t* ow, const int32_t* iw, const W* ww, S* y, int64_t p,
                                  int64_t q, int64_t total) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, total) {
    const int64_t k = i % c, col = (i / c) % q, row = (i / (c * q)) % p, img = i / (c * q * p);
    const S* xi = x + img * h * w * c + k;
    C acc = C(0);
    for (int32_t a = oh[row]; a < oh[row + 1]; ++a) {
      const S* xr = xi + static_cast<int64_t>(ih[a]) * w * c;
      const C weight_row = static_cast<C>(wh[a]);
      for (int32_t b = ow[col]; b < ow[col + 1]; ++b)
        acc += weight_row * static_cast<C>(ww[b]) * load_as<C>(xr[static_cast<int64_t>(iw[b]) * c]);
    }
    y[i] = store_as<S>(acc);
  }
}

void resample2d(const Tensor& x, const ResampleTaps& taps, Tensor& y) {
  const int64_t h = x.size(1), w = x.size(2), c = x.size(3), p = y.size(1), q = y.size(2);
  RT_CHECK(
      y.size(0) == x.size(0) && y.size(3) == c && taps.offsets_h.numel() == p + 1 && taps.offsets_w.numel() == q + 1,
      "resample2d: ", x.describe(), " -> ", y.describe(), " with tables for ", taps.offsets_h.numel() - 1, " x ",
      taps.offsets_w.numel() - 1, " outputs");
  const int64_t total = y.numel();
  if (total == 0) return;
  DeviceScope scope(y);
  dispatch_floating(x.dtype(), "resample2d", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using W = std::conditional_t<std::is_same_v<S, double>, double, float>;
    resample2d_kernel<S, W><<<grid_for(total), kThreads, 0, stream_now()>>>(
        x.data<S>(), h, w, c, taps.offsets_h.data<int32_t>(), taps.index_h.data<int32_t>(), taps.weight_h.data<W>(),
        taps.offsets_w.data<int32_t>(), taps.index_w.data<int32_t>(), taps.weight_w.data<W>(), y.data<S>(), p, q,
        total);
  });
}

}  // namespace

void register_resample_kernels(KernelTable& t) { t.resample2d = &resample2d; }

}  // namespace ringtrain::cuda
