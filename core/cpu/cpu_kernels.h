// core/cpu/cpu_kernels.h (internal: core/cpu/, core/parallel.cpp, core/allocator.cpp): what the CPU kernel files share.
// Each op family file (same base names as core/cuda/) fills its own KernelTable entries through a
// register_*_kernels function that cpu_kernels() (core/cpu/table.cpp) calls; the header also declares
// the few kernels one family calls in another, and holds the dtype dispatch, the parallel grain and the
// multiversioning marker the families share. Kernel functions are named after their KernelTable entry
// and live in ringtrain::cpu (the CUDA ones in ringtrain::cuda).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/check.h"
#include "core/dtype.h"
#include "core/dtype_visit.h"
#include "core/kernels.h"

namespace ringtrain::cpu {

// Explicit registration (a registry filled by static initializers would vanish from a static library).
void register_elementwise_kernels(KernelTable& t);  // elementwise.cpp: fill, convert, unary, binary, scalar
void register_random_kernels(KernelTable& t);       // random.cpp: uniform, normal, dropout
void register_reduce_kernels(KernelTable& t);       // reduce.cpp: sum / max over [outer, n, inner]
void register_gemm_kernels(KernelTable& t);         // gemm.cpp: OpenBLAS; bf16 on oneDNN or through f32
void register_softmax_kernels(KernelTable& t);      // softmax.cpp: (log-)softmax, cross-entropy, backward
void register_conv_kernels(KernelTable& t);         // conv.cpp: oneDNN (f32, bf16), direct loops for f64
void register_norm_pool_kernels(KernelTable& t);    // norm_pool.cpp: batch norm, max / average pooling
void register_optim_kernels(KernelTable& t);        // optim.cpp: fused SGD, AdamW, loss-scale unscaling
void register_shape_kernels(KernelTable& t);        // shape.cpp: strided copies (permute, cat, ...), where
void register_activation_kernels(KernelTable& t);   // activation.cpp: GELU, SiLU, hardswish, clamp, ...
void register_group_norm_kernels(KernelTable& t);   // group_norm.cpp: GroupNorm and LayerNorm
void register_resample_kernels(KernelTable& t);     // resample.cpp: adaptive average pooling, upsampling

// core/cpu/elementwise.cpp, also called by the GEMM (empty inner dimension, 16-bit conversions).
// Signatures and semantics are the KernelTable's.
void fill(Tensor& out, double value);
void convert(const Tensor& src, Tensor& dst);
void scalar(ScalarOp op, const Tensor& x, double s, Tensor& out);

// core/cpu/conv.cpp: sets oneDNN's (OpenMP) thread count; called by set_num_threads.
void set_onednn_threads(int n);
// Drop the cached plans (oneDNN primitives built per shape) of conv.cpp (with oneDNN's own primitive cache)
// and gemm.cpp; the next call of a shape builds its plan again (release_kernel_plans, core/allocator.h).
void release_conv_plans();
void release_matmul_plans();

// ---------------------------------------------------------------------------------------------------
// Shared by the family files

inline constexpr int64_t kGrain = 1 << 14;  // elements per task for cheap elementwise work

// Plans (oneDNN primitives and what runs them) by the key of the shape they were built for, thread-safe. A
// model has a few dozen; a run whose shapes keep changing is capped by starting over. Plans in use live on
// in their callers' shared_ptr, also after clear() (release_kernel_plans, core/allocator.h).
template <typename Key, typename Plan>
class PlanCache {
 public:
  template <typename Build>
  std::shared_ptr<const Plan> get(const Key& key, Build&& build) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    if (plans_.size() >= 1024) plans_.clear();
    return plans_.emplace(key, std::make_shared<const Plan>(build())).first->second;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    plans_.clear();
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const Plan>> plans_;
};

using ringtrain::TypeTag;
using ringtrain::visit_dtype;

// The floating dtypes' kernels; another dtype is an error naming the op.
template <typename Fn>
void visit_floating(DType dtype, const char* op, Fn&& fn) {
  ringtrain::visit_floating(dtype, std::forward<Fn>(fn),
                            [&] { RT_THROW("op '", op, "' has no CPU kernel for dtype ", dtype_name(dtype)); });
}

// f32 -> bf16 rounded to nearest even, NaN kept quiet: f32_to_bf16's bits (core/dtype.h) without its
// branch, so that loops over many elements vectorize (the branch kept them scalar).
[[gnu::always_inline]] inline BFloat16 to_bf16_flat(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = 0u - static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  return BFloat16{static_cast<uint16_t>((rounded & ~nan) | (((u >> 16) | 0x40u) & nan))};
}

// Vectorized f32 hot loops: one binary per ISA, picked at load time.
#define RT_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))

}  // namespace ringtrain::cpu
