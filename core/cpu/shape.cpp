// core/cpu/shape.cpp: the CPU kernels that move elements: strided_copy (permute, narrow, cat, expand and their
// backward) and where. Both see elements as bytes of their size (1, 2, 4 or 8): no arithmetic, so every dtype
// shares one loop. A copy is collapsed to its fewest dims first (core/kernels.h collapse); its innermost dim
// then runs as memcpy where both sides are contiguous in it.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

template <typename E>
void copy_rows(const E* src, E* dst, const StridedCopy& c) {
  const int nd = c.ndim, last = nd - 1;
  const int64_t run = c.dims[last], ss = c.src_stride[last], ds = c.dst_stride[last];
  int64_t rows = 1;
  for (int d = 0; d < last; ++d) rows *= c.dims[d];
  const bool contiguous = ss == 1 && ds == 1;
  parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(run, 1)), [&](int64_t lo, int64_t hi) {
    int64_t idx[kMaxDims] = {};
    int64_t rem = lo, so = c.src_offset, dof = c.dst_offset;
    for (int d = last - 1; d >= 0; --d) {
      idx[d] = rem % c.dims[d];
      rem /= c.dims[d];
      so += idx[d] * c.src_stride[d];
      dof += idx[d] * c.dst_stride[d];
    }
    for (int64_t r = lo; r < hi; ++r) {
      if (contiguous) {
        std::memcpy(dst + dof, src + so, static_cast<size_t>(run) * sizeof(E));
      } else {
        const E* s = src + so;
        E* t = dst + dof;
        for (int64_t j = 0; j < run; ++j) t[j * ds] = s[j * ss];
      }
      for (int d = last - 1; d >= 0; --d) {
        so += c.src_stride[d];
        dof += c.dst_stride[d];
        if (++idx[d] < c.dims[d]) break;
        so -= c.src_stride[d] * c.dims[d];
        dof -= c.dst_stride[d] * c.dims[d];
        idx[d] = 0;
      }
    }
  });
}

void strided_copy(const Tensor& src, Tensor& dst, const StridedCopy& copy) {
  RT_CHECK(src.dtype() == dst.dtype(), "strided_copy: ", src.describe(), " -> ", dst.describe(), " differ in dtype");
  const StridedCopy c = collapse(copy);
  switch (dtype_size(src.dtype())) {
    case 1:
      return copy_rows(src.data<uint8_t>(), dst.data<uint8_t>(), c);
    case 2:
      return copy_rows(src.data<uint16_t>(), dst.data<uint16_t>(), c);
    case 4:
      return copy_rows(src.data<uint32_t>(), dst.data<uint32_t>(), c);
    case 8:
      return copy_rows(src.data<uint64_t>(), dst.data<uint64_t>(), c);
    default:
      RT_THROW("strided_copy: no CPU kernel for elements of ", dtype_size(src.dtype()), " bytes");
  }
}

template <typename E>
void where_elements(const uint8_t* cond, const E* a, const E* b, E* out, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = cond[i] ? a[i] : b[i];
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = out.numel();
  RT_CHECK(
      cond.numel() == n && a.numel() == n && b.numel() == n && a.dtype() == out.dtype() && b.dtype() == out.dtype(),
      "where: ", cond.describe(), ", ", a.describe(), " and ", b.describe(), " do not all match ", out.describe());
  const uint8_t* c = cond.data<uint8_t>();
  switch (dtype_size(out.dtype())) {
    case 1:
      return where_elements(c, a.data<uint8_t>(), b.data<uint8_t>(), out.data<uint8_t>(), n);
    case 2:
      return where_elements(c, a.data<uint16_t>(), b.data<uint16_t>(), out.data<uint16_t>(), n);
    case 4:
      return where_elements(c, a.data<uint32_t>(), b.data<uint32_t>(), out.data<uint32_t>(), n);
    case 8:
      return where_elements(c, a.data<uint64_t>(), b.data<uint64_t>(), out.data<uint64_t>(), n);
    default:
      RT_THROW("where: no CPU kernel for elements of ", dtype_size(out.dtype()), " bytes");
  }
}

}  // namespace

void register_shape_kernels(KernelTable& t) {
  t.strided_copy = &strided_copy;
  t.where = &where;
}

}  // namespace ringtrain::cpu
