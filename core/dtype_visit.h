// core/dtype_visit.h: from a run-time DType to the storage type a kernel template is instantiated for. The
// CPU kernels (core/cpu/cpu_kernels.h) and the CUDA kernels (core/cuda/common.cuh) both dispatch through
// these, so the two device families cannot drift apart in which types they cover:
//   visit_dtype(t.dtype(), [&](auto tag) { using S = typename decltype(tag)::type; ... });
#pragma once

#include "core/check.h"
#include "core/dtype.h"

namespace ringtrain {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<storage type>) for every dtype.
template <typename Fn>
void visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32:
      fn(TypeTag<float>{});
      return;
    case DType::F64:
      fn(TypeTag<double>{});
      return;
    case DType::F16:
      fn(TypeTag<Half>{});
      return;
    case DType::BF16:
      fn(TypeTag<BFloat16>{});
      return;
    case DType::I32:
      fn(TypeTag<int32_t>{});
      return;
    case DType::I64:
      fn(TypeTag<int64_t>{});
      return;
    case DType::U8:
      fn(TypeTag<uint8_t>{});
      return;
  }
  RT_THROW("unknown dtype ", static_cast<int>(dtype));
}

// Calls fn(TypeTag<storage type>) for the floating dtypes (f32, f64, f16, bf16); unsupported() (which must
// not return: it throws the caller's message) for the others.
template <typename Fn, typename Unsupported>
void visit_floating(DType dtype, Fn&& fn, Unsupported&& unsupported) {
  switch (dtype) {
    case DType::F32:
      fn(TypeTag<float>{});
      return;
    case DType::F64:
      fn(TypeTag<double>{});
      return;
    case DType::F16:
      fn(TypeTag<Half>{});
      return;
    case DType::BF16:
      fn(TypeTag<BFloat16>{});
      return;
    default:
      unsupported();
  }
}

}  // namespace ringtrain
