// core/cuda/shape.cu: the CUDA kernels that move elements: strided_copy (permute, narrow, cat, expand and their
// backward) and where, on elements as words of their size (no arithmetic, so every dtype shares one kernel).
// As the CPU (core/cpu/shape.cpp) the copy is collapsed to its fewest dims first (core/kernels.h collapse); each
// thread then moves one element, its source and destination offsets decomposed from its index.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/check.h"
#include "core/cuda/common.cuh"
#include "core/cuda/cuda_kernels.h"
#include "core/kernels.h"
#include "core/tensor.h"

namespace ringtrain::cuda {
namespace {

using namespace cuda_common;

template <typename E>
__global__ void strided_copy_kernel(const E* src, E* dst, StridedCopy c, int64_t total) {
  RT_GRID_STRIDE(i, total) {
    int64_t rem = i, so = c.src_offset, dof = c.dst_offset;
    for (int d = c.ndim - 1; d >= 0; --d) {
      const int64_t k = rem % c.dims[d];
      rem /= c.dims[d];
      so += k * c.src_stride[d];
      dof += k * c.dst_stride[d];
    }
    dst[dof] = src[so];
  }
}

template <typename E>
void launch_copy(const Tensor& src, Tensor& dst, const StridedCopy& c, int64_t total) {
  strided_copy_kernel<E><<<grid_for(total), kThreads, 0, stream_now()>>>(src.data<E>(), dst.data<E>(), c, total);
}

void strided_copy(const Tensor& src, Tensor& dst, const StridedCopy& copy) {
  RT_CHECK(src.dtype() == dst.dtype(), "strided_copy: ", src.describe(), " -> ", dst.describe(), " differ in dtype");
  const StridedCopy c = collapse(copy);
  int64_t total = 1;
  for (int d = 0; d < c.ndim; ++d) total *= c.dims[d];
  if (total == 0) return;
  DeviceScope scope(dst);
  switch (dtype_size(src.dtype())) {
    case 1:
      return launch_copy<uint8_t>(src, dst, c, total);
    case 2:
      return launch_copy<uint16_t>(src, dst, c, total);
    case 4:
      return launch_copy<uint32_t>(src, dst, c, total);
    case 8:
      return launch_copy<uint64_t>(src, dst, c, total);
    default:
      RT_THROW("strided_copy: no CUDA kernel for elements of ", dtype_size(src.dtype()), " bytes");
  }
}

template <typename E>
__global__ void where_kernel(const uint8_t* cond, const E* a, const E* b, E* out, int64_t n) {
  RT_GRID_STRIDE(i, n) out[i] = cond[i] ? a[i] : b[i];
}

template <typename E>
void launch_where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out, int64_t n) {
  where_kernel<E>
      <<<grid_for(n), kThreads, 0, stream_now()>>>(cond.data<uint8_t>(), a.data<E>(), b.data<E>(), out.data<E>(), n);
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = out.numel();
  RT_CHECK(
      cond.numel() == n && a.numel() == n && b.numel() == n && a.dtype() == out.dtype() && b.dtype() == out.dtype(),
      "where: ", cond.describe(), ", ", a.describe(), " and ", b.describe(), " do not all match ", out.describe());
  if (n == 0) return;
  DeviceScope scope(out);
  switch (dtype_size(out.dtype())) {
    case 1:
      return launch_where<uint8_t>(cond, a, b, out, n);
    case 2:
      return launch_where<uint16_t>(cond, a, b, out, n);
    case 4:
      return launch_where<uint32_t>(cond, a, b, out, n);
    case 8:
      return launch_where<uint64_t>(cond, a, b, out, n);
    default:
      RT_THROW("where: no CUDA kernel for elements of ", dtype_size(out.dtype()), " bytes");
  }
}

}  // namespace

void register_shape_kernels(KernelTable& t) {
  t.strided_copy = &strided_copy;
  t.where = &where;
}

}  // namespace ringtrain::cuda
