// core/cuda/common.cuh (internal, CUDA sources only): launch helpers, dtype dispatch, device math and the
// fill kernel shared by the CUDA kernel files (core/cuda/<family>.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/dtype_visit.h"
#include "core/tensor.h"

namespace ringtrain::cuda_common {

// ---------------------------------------------------------------------------------------------------
// Launch helpers

constexpr int kThreads = 256;               // threads per block everywhere (reductions rely on a power of 2)
constexpr int64_t kMaxBlocks = 65535 * 32;  // grid-stride loops cover anything larger

inline cudaStream_t stream_now() { return static_cast<cudaStream_t>(current_stream().handle()); }

inline unsigned grid_for(int64_t n, int64_t per_block = kThreads) {
  return static_cast<unsigned>(std::min<int64_t>((n + per_block - 1) / per_block, kMaxBlocks));
}

// Kernels launch on the tensor's device; switching only when needed keeps the common single-device
// case to one cudaGetDevice per op.
class DeviceScope {
 public:
  explicit DeviceScope(const Tensor& t) {
    const Device d = t.device();
    RT_CHECK(d.is_cuda(), "CUDA kernel called with ", t.describe());
    int current = 0;
    CUDA_CHECK(cudaGetDevice(&current));
    if (current != d.index) {
      CUDA_CHECK(cudaSetDevice(d.index));
      previous_ = current;
    }
  }
  ~DeviceScope() {
    if (previous_ >= 0) CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// Grid-stride loop with index type I (int32_t where the caller knows every index fits: 64-bit division and
// modulo cost several times as much); RT_GRID_STRIDE is the int64_t one.
#define RT_GRID_STRIDE_AS(I, i, n)                                                                           \
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < (n); \
       i += static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x))
#define RT_GRID_STRIDE(i, n) RT_GRID_STRIDE_AS(int64_t, i, n)

// out[i] = value: the fill op (core/cuda/elementwise.cu), and cross_entropy's bad-row flag
// (core/cuda/softmax.cu), which needs an exact i64 that the fill op's double value cannot carry.
template <typename S>
__global__ void fill_kernel(S* out /* (n) */, S value, int64_t n) {
  RT_GRID_STRIDE(i, n) out[i] = value;
}

// ---------------------------------------------------------------------------------------------------
// 16-byte vectors: the memory-bound kernels move kVec<S> elements per load and store (8 of a 16-bit
// type, 4 f32, 2 f64), one ld/st.global.v4 each, where the pointers are 16-byte aligned. The arithmetic
// per element is the scalar kernels' own, so a vector path gives the scalar path's bits.

template <typename S>
constexpr int kVec = sizeof(S) <= 16 ? static_cast<int>(16 / sizeof(S)) : 1;

template <typename S>
struct alignas(16) Vec {
  S v[kVec<S>];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Every pointer 16-byte aligned (a null one, an input that is not there, counts as aligned).
template <typename... P>
bool all_aligned16(const P*... p) {
  return ((p == nullptr || aligned16(p)) && ...);
}

// ---------------------------------------------------------------------------------------------------
// Types: storage type S, compute type compute_t<S> (core/dtype.h).

template <typename T>
using Tag = TypeTag<T>;  // core/dtype_visit.h

[[noreturn]] inline void raise_unsupported(const char* op, DType t) {
  RT_THROW("op '", op, "': the CUDA kernel does not support dtype ", dtype_name(t));
}

// The dtype of a compute type (workspaces of partial results).
template <typename A>
constexpr DType accumulator_dtype() {
  if constexpr (std::is_same_v<A, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<A, double>)
    return DType::F64;
  else
    return DType::I64;
}

template <typename F>
void dispatch_all(DType t, F&& f) {
  visit_dtype(t, std::forward<F>(f));
}

template <typename F>
void dispatch_floating(DType t, const char* op, F&& f) {
  visit_floating(t, std::forward<F>(f), [&] { raise_unsupported(op, t); });
}

// ---------------------------------------------------------------------------------------------------
// Device math: explicit float / double overloads (CUDA's float overloads of exp etc. would make integer
// arguments ambiguous, and we never want a silent float -> double promotion).

__device__ inline float dev_exp(float x) { return expf(x); }
__device__ inline double dev_exp(double x) { return exp(x); }
__device__ inline float dev_log(float x) { return logf(x); }
__device__ inline double dev_log(double x) { return log(x); }
__device__ inline float dev_sqrt(float x) { return sqrtf(x); }
__device__ inline double dev_sqrt(double x) { return sqrt(x); }
__device__ inline float dev_tanh(float x) { return tanhf(x); }
__device__ inline double dev_tanh(double x) { return tanh(x); }
__device__ inline float dev_pow(float x, float y) { return powf(x, y); }
__device__ inline double dev_pow(double x, double y) { return pow(x, y); }

template <typename C>
__device__ inline C dev_neg_infinity() {
  if constexpr (std::is_same_v<C, double>)
    return __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
  else
    return __int_as_float(static_cast<int>(0xff800000u));
}

template <typename C>
__device__ inline bool dev_isnan(C v) {
  if constexpr (std::is_floating_point_v<C>)
    return v != v;
  else
    return false;
}

// NaN-propagating max / min, ties keep a: the CPU's (a >= b || a != a) ? a : b and its mirror.
template <typename C>
__device__ inline C nan_max(C a, C b) {
  if (dev_isnan(a)) return a;
  if (dev_isnan(b)) return b;
  return a < b ? b : a;
}
template <typename C>
__device__ inline C nan_min(C a, C b) {
  if (dev_isnan(a)) return a;
  if (dev_isnan(b)) return b;
  return b < a ? b : a;
}

// Fixed-order tree over the block (blockDim.x a power of 2, at most kThreads); deterministic for a given
// block size. Every thread gets the result.
template <typename T, typename Op>
__device__ T block_reduce(T value, T* shared /* (blockDim.x) */, Op op) {
  const unsigned t = threadIdx.x;
  shared[t] = value;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) shared[t] = op(shared[t], shared[t + s]);
    __syncthreads();
  }
  T result = shared[0];
  __syncthreads();  // the caller may reuse `shared` right away
  return result;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return nan_max(a, b);
  }
};

}  // namespace ringtrain::cuda_common
