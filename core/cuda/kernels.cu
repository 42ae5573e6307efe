// core/cuda/kernels.cu: the CUDA kernel table (core/kernels.h): elementwise, random, reductions, GEMM
// (cuBLAS), softmax, cross-entropy and dropout for CUDA tensors, plus the per-op error check. Semantics
// match the CPU table entry by entry; every kernel is deterministic (fixed-order tree reductions, no
// floating-point atomics) and runs on the calling thread's current stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cuda/common.cuh"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_kernels.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/kernels.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace ringtrain {
namespace {

// Launch helpers, dtype dispatch and device math: core/cuda/common.cuh.
using namespace cuda_common;

// ---------------------------------------------------------------------------------------------------
// fill, convert

template <typename S>
__global__ void fill_kernel(S* out /* (n) */, S value, int64_t n) {
  RT_GRID_STRIDE(i, n) out[i] = value;
}

void fill_cuda(Tensor& out, double value) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_all(out.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    // Converted once on the host exactly as the CPU does (through the compute type, so integers wrap).
    const S v = store_as<S>(static_cast<compute_t<S>>(value));
    fill_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(out.data<S>(), v, n);
  });
}

// As the CPU: floating -> integer truncates toward zero through i64 (so u8 wraps); other pairs go through
// f64, except integer -> integer, which converts directly (through f64 an i64 above 2^53 would change).
template <typename D, typename S>
__device__ inline D convert_value(S v) {
  if constexpr (std::is_same_v<S, D>) return v;
  else if constexpr (std::is_integral_v<D> && std::is_integral_v<S>) return static_cast<D>(v);
  else if constexpr (std::is_integral_v<D>) return static_cast<D>(static_cast<int64_t>(load_as<double>(v)));
  else return store_as<D>(load_as<double>(v));
}

template <typename S, typename D>
__global__ void convert_kernel(const S* src /* (n) */, D* dst /* (n) */, int64_t n) {
  RT_GRID_STRIDE(i, n) dst[i] = convert_value<D>(src[i]);
}

void convert_cuda(const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  RT_CHECK(dst.numel() == n, "convert: ", src.describe(), " -> ", dst.describe(), " differ in size");
  if (n == 0) return;
  DeviceScope scope(dst);
  dispatch_all(src.dtype(), [&](auto src_tag) {
    using S = typename decltype(src_tag)::type;
    dispatch_all(dst.dtype(), [&](auto dst_tag) {
      using D = typename decltype(dst_tag)::type;
      convert_kernel<S, D><<<grid_for(n), kThreads, 0, stream_now()>>>(src.data<S>(), dst.data<D>(), n);
    });
  });
}

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
__global__ void normal_kernel(S* out /* (n) */, int64_t n, uint64_t seed, uint64_t stream, double mean,
                              double stddev) {
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

void uniform_cuda(Tensor& out, uint64_t seed, uint64_t stream, double low, double high) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_floating(out.dtype(), "uniform", [&](auto tag) {
    using S = typename decltype(tag)::type;
    uniform_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(out.data<S>(), n, seed, stream, low, high - low);
  });
}

void normal_cuda(Tensor& out, uint64_t seed, uint64_t stream, double mean, double stddev) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_floating(out.dtype(), "normal", [&](auto tag) {
    using S = typename decltype(tag)::type;
    normal_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(out.data<S>(), n, seed, stream, mean, stddev);
  });
}

// ---------------------------------------------------------------------------------------------------
// unary

template <typename C>
__device__ inline C unary_value(UnaryOp op, C v) {
  if constexpr (std::is_integral_v<C>) {
    switch (op) {
      case UnaryOp::Neg: return -v;
      case UnaryOp::Abs: return v < 0 ? -v : v;
      case UnaryOp::Relu: return v > 0 ? v : C(0);
      default: return C(0);  // rejected on the host
    }
  } else {
    switch (op) {
      case UnaryOp::Neg: return -v;
      case UnaryOp::Relu: return v > C(0) ? v : C(0);  // as the CPU: NaN -> 0
      case UnaryOp::Exp: return dev_exp(v);
      case UnaryOp::Log: return dev_log(v);
      case UnaryOp::Sqrt: return dev_sqrt(v);
      case UnaryOp::Abs: return v < C(0) ? -v : v;  // as the CPU: -0 and NaN keep their sign bit
      case UnaryOp::Tanh: return dev_tanh(v);
      case UnaryOp::Sigmoid: return C(1) / (C(1) + dev_exp(-v));
    }
    return v;
  }
}

template <typename S>
__global__ void unary_kernel(UnaryOp op, const S* x /* (n) */, S* out /* (n) */, int64_t n) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, n) out[i] = store_as<S>(unary_value<C>(op, load_as<C>(x[i])));
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
  }
  return "unary";
}

void unary_cuda(UnaryOp op, const Tensor& x, Tensor& out) {
  const int64_t n = x.numel();
  const bool integer_ok = op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu;
  if (!is_floating(x.dtype()) && !integer_ok) raise_unsupported(unary_name(op), x.dtype());
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_all(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    unary_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(op, x.data<S>(), out.data<S>(), n);
  });
}

// ---------------------------------------------------------------------------------------------------
// binary (with broadcasting)

template <typename C>
__device__ inline C binary_value(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div:
      // Integer division by zero is undefined in C++ and traps on the CPU; define it as 0 here.
      if constexpr (std::is_integral_v<C>) return b == 0 ? C(0) : a / b;
      else return a / b;
    case BinaryOp::Maximum: return nan_max(a, b);
    case BinaryOp::Minimum: return nan_min(a, b);
    case BinaryOp::Eq: return C(a == b);
    case BinaryOp::Ne: return C(a != b);
    case BinaryOp::Lt: return C(a < b);
    case BinaryOp::Le: return C(a <= b);
    case BinaryOp::Gt: return C(a > b);
    case BinaryOp::Ge: return C(a >= b);
    case BinaryOp::ReluGrad: return b > C(0) ? a : C(0);  // as the CPU: masked entries are 0 even if a is inf/NaN
  }
  return C(0);
}

// How each input maps out index i to its own index. `tail` inputs repeat along the leading dims only
// (same shape, scalar, bias over the last dims): index i % numel. Anything else decomposes i over
// out_dims and dots with the input's strides.
struct BinaryIndexing {
  bool general = false;
  int64_t a_numel = 0, b_numel = 0;
  BroadcastDesc bc;
};

bool broadcasts_as_tail(const BroadcastDesc& bc, const int64_t* stride, int64_t in_numel) {
  int64_t running = 1;
  for (int d = bc.ndim - 1; d >= 0; --d) {
    const int64_t size = bc.out_dims[d];
    if (size == 1) continue;  // the stride along a size-1 dim is never used
    if (running < in_numel) {
      if (stride[d] != running) return false;
      running *= size;
    } else if (stride[d] != 0) {
      return false;
    }
  }
  return running == in_numel;
}

template <typename S, typename O>
__global__ void binary_kernel(BinaryOp op, const S* a, const S* b, O* out /* (n), may alias a */, int64_t n,
                              BinaryIndexing ix) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, n) {
    int64_t ai, bi;
    if (ix.general) {
      ai = 0;
      bi = 0;
      int64_t rest = i;
      for (int d = ix.bc.ndim - 1; d >= 0; --d) {
        const int64_t coord = rest % ix.bc.out_dims[d];
        rest /= ix.bc.out_dims[d];
        ai += coord * ix.bc.a_stride[d];
        bi += coord * ix.bc.b_stride[d];
      }
    } else {
      ai = ix.a_numel == n ? i : i % ix.a_numel;
      bi = ix.b_numel == n ? i : i % ix.b_numel;
    }
    out[i] = store_as<O>(binary_value<C>(op, load_as<C>(a[ai]), load_as<C>(b[bi])));
  }
}

void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, const BroadcastDesc& bc) {
  const int64_t n = out.numel();
  if (op == BinaryOp::ReluGrad && !is_floating(a.dtype())) raise_unsupported("relu_backward", a.dtype());
  RT_CHECK(a.dtype() == b.dtype(), "binary: dtypes differ: ", a.describe(), " and ", b.describe());
  if (n == 0) return;
  BinaryIndexing ix;
  ix.a_numel = a.numel();
  ix.b_numel = b.numel();
  ix.bc = bc;
  ix.general = !broadcasts_as_tail(bc, bc.a_stride, ix.a_numel) || !broadcasts_as_tail(bc, bc.b_stride, ix.b_numel);
  DeviceScope scope(out);
  dispatch_all(a.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (is_comparison(op)) {
      RT_CHECK(out.dtype() == DType::U8, "comparison output must be u8, got ", out.describe());
      binary_kernel<S, uint8_t>
          <<<grid_for(n), kThreads, 0, stream_now()>>>(op, a.data<S>(), b.data<S>(), out.data<uint8_t>(), n, ix);
    } else {
      binary_kernel<S, S><<<grid_for(n), kThreads, 0, stream_now()>>>(op, a.data<S>(), b.data<S>(), out.data<S>(), n,
                                                                       ix);
    }
  });
}

// ---------------------------------------------------------------------------------------------------
// scalar

// As the CPU: s is converted to the compute type (integers: truncated to i64), except that integer Mul
// scales in f64 (so `x * 0.5` halves) and truncates back through i64.
template <typename S>
__global__ void scalar_kernel(ScalarOp op, const S* x /* (n) */, double s, S* out /* (n), may alias x */,
                              int64_t n) {
  using C = compute_t<S>;
  const C sv = static_cast<C>(s);
  RT_GRID_STRIDE(i, n) {
    const C v = load_as<C>(x[i]);
    C r = v;
    if constexpr (std::is_integral_v<C>) {
      switch (op) {
        case ScalarOp::Add: r = v + sv; break;
        case ScalarOp::Mul: r = static_cast<C>(static_cast<double>(v) * s); break;
        case ScalarOp::RSub: r = sv - v; break;
        default: break;  // RDiv / Pow: rejected on the host
      }
    } else {
      switch (op) {
        case ScalarOp::Add: r = v + sv; break;
        case ScalarOp::Mul: r = v * sv; break;
        case ScalarOp::RSub: r = sv - v; break;
        case ScalarOp::RDiv: r = sv / v; break;
        case ScalarOp::Pow: r = dev_pow(v, sv); break;
      }
    }
    out[i] = store_as<S>(r);
  }
}

void scalar_cuda(ScalarOp op, const Tensor& x, double s, Tensor& out) {
  const int64_t n = x.numel();
  if (op == ScalarOp::RDiv && !is_floating(x.dtype())) raise_unsupported("rdiv", x.dtype());
  if (op == ScalarOp::Pow && !is_floating(x.dtype())) raise_unsupported("pow", x.dtype());
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_all(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    scalar_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(op, x.data<S>(), s, out.data<S>(), n);
  });
}

// ---------------------------------------------------------------------------------------------------
// reduce: x [outer, n, inner] -> out [outer, inner]. Deterministic work shapes, chosen from the shape
// alone (never from the GPU model), so a given shape always sums in the same order:
//  * serial: one thread per output walks n in order (short rows);
//  * segments: one block per (output, part), threads along n, fixed-order tree (inner == 1, or a small
//    inner where strided loads cost little);
//  * columns: one block per (32 consecutive outputs along inner, part): lanes along inner so loads are
//    coalesced, 8 rows of threads along n, fixed-order tree over the rows (bias / channel gradients).
// parts > 1 only when there are few outputs and long rows; a second kernel then combines each output's
// parts in order. Max keeps (value, index): the first NaN wins, else the largest value with the smallest
// index.

template <typename A>
__device__ inline bool max_better(A v, int64_t i, A best, int64_t best_i) {
  if (i < 0) return false;
  if (best_i < 0) return true;  // nothing seen yet
  const bool v_nan = dev_isnan(v), best_nan = dev_isnan(best);
  if (v_nan || best_nan) return v_nan && (!best_nan || i < best_i);
  return v > best || (v == best && i < best_i);
}

template <typename S, ReduceOp kOp>
__global__ void reduce_serial_kernel(const S* x /* (outer, n, inner) */, int64_t outer, int64_t n, int64_t inner,
                                     S* out /* (outer, inner) */, int64_t* argmax /* (outer, inner) or null */) {
  using A = compute_t<S>;
  RT_GRID_STRIDE(o, outer * inner) {
    const S* row = x + (o / inner) * n * inner + (o % inner);  // element j at row[j * inner]
    A acc = A(0);
    int64_t index = -1;
    for (int64_t j = 0; j < n; ++j) {
      const A v = load_as<A>(row[j * inner]);
      if constexpr (kOp == ReduceOp::Sum) {
        acc += v;
      } else if (max_better(v, j, acc, index)) {
        acc = v;
        index = j;
      }
    }
    out[o] = store_as<S>(acc);
    if (argmax) argmax[o] = index;
  }
}

template <typename S, ReduceOp kOp>
__global__ void reduce_segments_kernel(const S* x /* (outer, n, inner) */, int64_t outer, int64_t n, int64_t inner,
                                       int64_t parts, int64_t chunk, S* out /* (outer, inner), parts == 1 */,
                                       int64_t* argmax /* (outer, inner) or null, parts == 1 */,
                                       compute_t<S>* partial_value /* (outer * inner, parts), parts > 1 */,
                                       int64_t* partial_index /* (outer * inner, parts), Max and parts > 1 */) {
  using A = compute_t<S>;
  __shared__ A values[kThreads];
  __shared__ int64_t indices[kThreads];
  const unsigned t = threadIdx.x;
  const int64_t segments = outer * inner * parts;
  for (int64_t segment = blockIdx.x; segment < segments; segment += gridDim.x) {
    const int64_t o = segment / parts, part = segment % parts;
    const S* row = x + (o / inner) * n * inner + (o % inner);
    const int64_t begin = part * chunk, end = min(n, begin + chunk);
    A acc = A(0);
    int64_t index = -1;
    for (int64_t j = begin + t; j < end; j += blockDim.x) {
      const A v = load_as<A>(row[j * inner]);
      if constexpr (kOp == ReduceOp::Sum) {
        acc += v;
      } else if (max_better(v, j, acc, index)) {
        acc = v;
        index = j;
      }
    }
    values[t] = acc;
    indices[t] = index;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
      if (t < s) {
        if constexpr (kOp == ReduceOp::Sum) {
          values[t] += values[t + s];
        } else if (max_better(values[t + s], indices[t + s], values[t], indices[t])) {
          values[t] = values[t + s];
          indices[t] = indices[t + s];
        }
      }
      __syncthreads();
    }
    if (t == 0) {
      if (parts == 1) {
        out[o] = store_as<S>(values[0]);
        if (argmax) argmax[o] = indices[0];
      } else {
        partial_value[segment] = values[0];
        if (partial_index) partial_index[segment] = indices[0];
      }
    }
    __syncthreads();  // values / indices are reused by the next segment
  }
}

// Lanes along inner, rows of threads along n: block (tile, part) covers outputs
// [tile * 32, tile * 32 + 32) of one outer index and rows [part * chunk, (part + 1) * chunk).
constexpr int kColumnLanes = 32;
constexpr int kColumnRows = kThreads / kColumnLanes;

template <typename S, ReduceOp kOp>
__global__ void reduce_columns_kernel(const S* x /* (outer, n, inner) */, int64_t outer, int64_t n, int64_t inner,
                                      int64_t parts, int64_t chunk, S* out /* (outer, inner), parts == 1 */,
                                      int64_t* argmax /* (outer, inner) or null, parts == 1 */,
                                      compute_t<S>* partial_value /* (outer * inner, parts), parts > 1 */,
                                      int64_t* partial_index /* (outer * inner, parts), Max and parts > 1 */) {
  using A = compute_t<S>;
  __shared__ A values[kColumnRows][kColumnLanes];
  __shared__ int64_t indices[kColumnRows][kColumnLanes];
  const unsigned lane = threadIdx.x % kColumnLanes, row = threadIdx.x / kColumnLanes;
  const int64_t tiles_per_outer = (inner + kColumnLanes - 1) / kColumnLanes;
  const int64_t work = outer * tiles_per_outer * parts;
  for (int64_t w = blockIdx.x; w < work; w += gridDim.x) {
    const int64_t part = w % parts, tile = w / parts;
    const int64_t oi = tile / tiles_per_outer, ii = (tile % tiles_per_outer) * kColumnLanes + lane;
    const bool active = ii < inner;
    const int64_t begin = part * chunk, end = min(n, begin + chunk);
    A acc = A(0);
    int64_t index = -1;
    if (active) {
      const S* column = x + oi * n * inner + ii;  // element j at column[j * inner]
      for (int64_t j = begin + row; j < end; j += kColumnRows) {
        const A v = load_as<A>(column[j * inner]);
        if constexpr (kOp == ReduceOp::Sum) {
          acc += v;
        } else if (max_better(v, j, acc, index)) {
          acc = v;
          index = j;
        }
      }
    }
    values[row][lane] = acc;
    indices[row][lane] = index;
    __syncthreads();
    for (unsigned s = kColumnRows / 2; s > 0; s >>= 1) {
      if (row < s) {
        if constexpr (kOp == ReduceOp::Sum) {
          values[row][lane] += values[row + s][lane];
        } else if (max_better(values[row + s][lane], indices[row + s][lane], values[row][lane],
                              indices[row][lane])) {
          values[row][lane] = values[row + s][lane];
          indices[row][lane] = indices[row + s][lane];
        }
      }
      __syncthreads();
    }
    if (row == 0 && active) {
      const int64_t o = oi * inner + ii;
      if (parts == 1) {
        out[o] = store_as<S>(values[0][lane]);
        if (argmax) argmax[o] = indices[0][lane];
      } else {
        partial_value[o * parts + part] = values[0][lane];
        if (partial_index) partial_index[o * parts + part] = indices[0][lane];
      }
    }
    __syncthreads();  // values / indices are reused by the next tile
  }
}

template <typename S, ReduceOp kOp>
__global__ void reduce_partials_kernel(const compute_t<S>* partial_value /* (outputs, parts) */,
                                       const int64_t* partial_index /* (outputs, parts) or null */, int64_t outputs,
                                       int64_t parts, S* out /* (outputs) */, int64_t* argmax /* or null */) {
  using A = compute_t<S>;
  RT_GRID_STRIDE(o, outputs) {
    A acc = A(0);
    int64_t index = -1;
    for (int64_t p = 0; p < parts; ++p) {
      const A v = partial_value[o * parts + p];
      if constexpr (kOp == ReduceOp::Sum) {
        acc += v;
      } else if (max_better(v, partial_index[o * parts + p], acc, index)) {
        acc = v;
        index = partial_index[o * parts + p];
      }
    }
    out[o] = store_as<S>(acc);
    if (argmax) argmax[o] = index;
  }
}

template <typename S, ReduceOp kOp>
void launch_reduce(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out, int64_t* argmax) {
  using A = compute_t<S>;
  const int64_t outputs = outer * inner;
  cudaStream_t stream = stream_now();
  if (n <= 8 || (inner == 1 && n <= 32)) {
    reduce_serial_kernel<S, kOp><<<grid_for(outputs), kThreads, 0, stream>>>(x.data<S>(), outer, n, inner,
                                                                               out.data<S>(), argmax);
    return;
  }
  // Strided loads waste little while inner is small; from 8 on, coalescing along inner wins.
  const bool columns = inner >= 8;
  const int64_t blocks_per_part = columns ? outer * ((inner + kColumnLanes - 1) / kColumnLanes) : outputs;
  // Split long rows when there are too few blocks to fill the GPU.
  constexpr int64_t kMinChunk = 8192, kTargetBlocks = 2048, kMaxParts = 1024;
  int64_t parts = std::min<int64_t>({(n + kMinChunk - 1) / kMinChunk,
                                     std::max<int64_t>(1, kTargetBlocks / blocks_per_part), kMaxParts});
  parts = std::max<int64_t>(parts, 1);
  const int64_t chunk = (n + parts - 1) / parts;
  parts = (n + chunk - 1) / chunk;  // no empty parts
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_per_part * parts, kMaxBlocks));

  Tensor partial_value, partial_index;
  A* partial_value_ptr = nullptr;
  int64_t* partial_index_ptr = nullptr;
  S* out_ptr = out.data<S>();
  int64_t* argmax_ptr = argmax;
  if (parts > 1) {
    partial_value = Tensor::empty(Shape{outputs * parts}, accumulator_dtype<A>(), x.device());
    partial_value_ptr = partial_value.data<A>();
    if (kOp == ReduceOp::Max) {
      partial_index = Tensor::empty(Shape{outputs * parts}, DType::I64, x.device());
      partial_index_ptr = partial_index.data<int64_t>();
    }
    out_ptr = nullptr;  // the first pass writes partials only
    argmax_ptr = nullptr;
  }
  if (columns) {
    reduce_columns_kernel<S, kOp><<<blocks, kThreads, 0, stream>>>(x.data<S>(), outer, n, inner, parts, chunk, out_ptr,
                                                                   argmax_ptr, partial_value_ptr, partial_index_ptr);
  } else {
    reduce_segments_kernel<S, kOp><<<blocks, kThreads, 0, stream>>>(x.data<S>(), outer, n, inner, parts, chunk,
                                                                    out_ptr, argmax_ptr, partial_value_ptr,
                                                                    partial_index_ptr);
  }
  if (parts > 1) {
    reduce_partials_kernel<S, kOp><<<grid_for(outputs), kThreads, 0, stream>>>(
        partial_value_ptr, partial_index_ptr, outputs, parts, out.data<S>(), argmax);
  }
  // The partial buffers return to the caching allocator under this stream, so whatever reuses them is
  // ordered after the kernels above.
}

void reduce_cuda(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out,
                 Tensor* argmax) {
  const char* name = op == ReduceOp::Sum ? "sum" : "max";
  RT_CHECK(out.dtype() == x.dtype(), "op '", name, "': output ", out.describe(), " must have the dtype of ",
           x.describe());
  RT_CHECK(!argmax || !argmax->defined() || argmax->dtype() == DType::I64, "op '", name, "': argmax must be i64");
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  if (n == 0) {
    RT_CHECK(op == ReduceOp::Sum, "op 'max' of an empty dimension");
    fill_cuda(out, 0.0);
    return;
  }
  DeviceScope scope(out);
  int64_t* argmax_ptr = argmax && argmax->defined() ? argmax->data<int64_t>() : nullptr;
  dispatch_all(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (op == ReduceOp::Sum) launch_reduce<S, ReduceOp::Sum>(x, outer, n, inner, out, nullptr);
    else launch_reduce<S, ReduceOp::Max>(x, outer, n, inner, out, argmax_ptr);
  });
}

// ---------------------------------------------------------------------------------------------------
// gemm (cuBLAS)

// One handle per device per thread: cuBLAS handles are not meant to be shared by threads that set
// different streams. Destroyed when the thread exits.
class CublasHandles {
 public:
  CublasHandles() = default;
  CublasHandles(const CublasHandles&) = delete;
  CublasHandles& operator=(const CublasHandles&) = delete;
  ~CublasHandles() {
    for (cublasHandle_t handle : handles_) {
      if (handle) CUBLAS_CHECK_NOTHROW(cublasDestroy(handle));
    }
  }
  // The caller has made `device` current (cublasCreate binds the handle to the current device).
  cublasHandle_t get(int device) {
    if (device >= static_cast<int>(handles_.size())) handles_.resize(static_cast<size_t>(device) + 1, nullptr);
    cublasHandle_t& handle = handles_[static_cast<size_t>(device)];
    if (!handle) CUBLAS_CHECK(cublasCreate(&handle));
    return handle;
  }

 private:
  std::vector<cublasHandle_t> handles_;
};

cublasHandle_t cublas_handle(int device) {
  thread_local CublasHandles handles;
  return handles.get(device);
}

void gemm_cuda(const GemmArgs& g, const Tensor& a, const Tensor& b, Tensor& c, int64_t batch, int64_t stride_a,
               int64_t stride_b, int64_t stride_c) {
  RT_CHECK(a.dtype() == b.dtype() && b.dtype() == c.dtype(), "gemm: dtypes differ: ", a.describe(), ", ",
           b.describe(), ", ", c.describe());
  if (g.m == 0 || g.n == 0 || batch == 0) return;
  if (g.k == 0) {
    // An empty inner dimension: C = beta * C (all batches), spelled out as on the CPU.
    if (g.beta == 0.0) fill_cuda(c, 0.0);
    else scalar_cuda(ScalarOp::Mul, c, g.beta, c);
    return;
  }
  cudaDataType data_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  switch (a.dtype()) {
    case DType::F32:
      data_type = CUDA_R_32F;
      compute = g.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      break;
    case DType::F64:
      data_type = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      break;
    case DType::F16:
      data_type = CUDA_R_16F;
      compute = CUBLAS_COMPUTE_32F;
      break;
    case DType::BF16:
      data_type = CUDA_R_16BF;
      compute = CUBLAS_COMPUTE_32F;
      break;
    default: raise_unsupported("matmul", a.dtype());
  }
  DeviceScope scope(c);
  cublasHandle_t handle = cublas_handle(c.device().index);
  CUBLAS_CHECK(cublasSetStream(handle, stream_now()));
  // alpha / beta have the compute type's scalar type: f64 for COMPUTE_64F, f32 otherwise.
  const double alpha_f64 = g.alpha, beta_f64 = g.beta;
  const float alpha_f32 = static_cast<float>(g.alpha), beta_f32 = static_cast<float>(g.beta);
  const bool f64 = compute == CUBLAS_COMPUTE_64F;
  const void* alpha = f64 ? static_cast<const void*>(&alpha_f64) : static_cast<const void*>(&alpha_f32);
  const void* beta = f64 ? static_cast<const void*>(&beta_f64) : static_cast<const void*>(&beta_f32);
  // Row-major C (m x n) is column-major C^T (n x m), and C^T = op(B)^T op(A)^T: pass B first, with the
  // row-major leading dimensions unchanged.
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(handle, op_b, op_a, g.n, g.m, g.k, alpha, b.data_ptr(), data_type, g.ldb,
                                             stride_b, a.data_ptr(), data_type, g.lda, stride_a, beta, c.data_ptr(),
                                             data_type, g.ldc, stride_c, batch, compute, CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------------------------------------------
// softmax, softmax_backward: one block per row, rows grid-strided.

unsigned row_threads(int64_t cols) {
  unsigned threads = 32;
  while (threads < kThreads && static_cast<int64_t>(threads) < cols) threads *= 2;
  return threads;
}

template <typename S>
__global__ void softmax_kernel(const S* x /* (rows, cols) */, int64_t rows, int64_t cols, bool log_softmax,
                               S* out /* (rows, cols) */) {
  using C = compute_t<S>;
  __shared__ C shared[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* in = x + r * cols;
    S* y = out + r * cols;
    C max_value = dev_neg_infinity<C>();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) max_value = nan_max(max_value, load_as<C>(in[c]));
    max_value = block_reduce(max_value, shared, MaxOp{});
    C sum = C(0);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += dev_exp(load_as<C>(in[c]) - max_value);
    sum = block_reduce(sum, shared, SumOp{});
    // Same rounding steps as the CPU: x - (max + log(sum)) and exp(x - max) * (1 / sum).
    if (log_softmax) {
      const C lse = max_value + dev_log(sum);
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[c] = store_as<S>(load_as<C>(in[c]) - lse);
    } else {
      const C inv = C(1) / sum;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[c] = store_as<S>(dev_exp(load_as<C>(in[c]) - max_value) * inv);
    }
  }
}

// softmax: dx = y * (dy - sum(dy * y)); log-softmax: dx = dy - exp(y) * sum(dy).
template <typename S>
__global__ void softmax_backward_kernel(const S* y /* (rows, cols) */, const S* dy /* (rows, cols) */, int64_t rows,
                                        int64_t cols, bool log_softmax, S* dx /* (rows, cols) */) {
  using C = compute_t<S>;
  __shared__ C shared[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* yr = y + r * cols;
    const S* dyr = dy + r * cols;
    S* dxr = dx + r * cols;
    C sum = C(0);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const C g = load_as<C>(dyr[c]);
      sum += log_softmax ? g : g * load_as<C>(yr[c]);
    }
    sum = block_reduce(sum, shared, SumOp{});
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const C g = load_as<C>(dyr[c]), v = load_as<C>(yr[c]);
      dxr[c] = store_as<S>(log_softmax ? g - dev_exp(v) * sum : v * (g - sum));
    }
  }
}

void softmax_cuda(const Tensor& x, int64_t rows, int64_t cols, bool log, Tensor& out) {
  if (rows == 0 || cols == 0) return;
  DeviceScope scope(out);
  const char* name = log ? "log_softmax" : "softmax";
  dispatch_floating(x.dtype(), name, [&](auto tag) {
    using S = typename decltype(tag)::type;
    softmax_kernel<S><<<grid_for(rows, 1), row_threads(cols), 0, stream_now()>>>(x.data<S>(), rows, cols, log,
                                                                                 out.data<S>());
  });
}

void softmax_backward_cuda(const Tensor& y, const Tensor& dy, int64_t rows, int64_t cols, bool log, Tensor& dx) {
  if (rows == 0 || cols == 0) return;
  RT_CHECK(y.dtype() == dy.dtype() && dy.dtype() == dx.dtype(), "softmax_backward: dtypes differ: ", y.describe(),
           ", ", dy.describe(), ", ", dx.describe());
  DeviceScope scope(dx);
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  dispatch_floating(y.dtype(), name, [&](auto tag) {
    using S = typename decltype(tag)::type;
    softmax_backward_kernel<S><<<grid_for(rows, 1), row_threads(cols), 0, stream_now()>>>(
        y.data<S>(), dy.data<S>(), rows, cols, log, dx.data<S>());
  });
}

// ---------------------------------------------------------------------------------------------------
// cross_entropy, cross_entropy_backward

constexpr int64_t kNoBadRow = std::numeric_limits<int64_t>::max();

// One block per row: log_probs = x - (max + log(sum exp(x - max))), and the loss from the log-probs as
// stored (rounded to S), as the CPU. A row with a label outside [0, cols) reports itself through an
// atomicMin, which keeps the first such row whatever the block order (the dispatcher then throws).
template <typename S, typename L>
__global__ void cross_entropy_kernel(const S* logits /* (rows, cols) */, const L* labels /* (rows) */, int64_t rows,
                                     int64_t cols, double smoothing, S* log_probs /* (rows, cols) */,
                                     compute_t<S>* loss /* (rows) */, int64_t* bad_row /* (1) or null */) {
  using C = compute_t<S>;
  __shared__ C shared[kThreads];
  const C on = C(1) - static_cast<C>(smoothing), off = static_cast<C>(smoothing) / static_cast<C>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* in = logits + r * cols;
    S* out = log_probs + r * cols;
    C max_value = dev_neg_infinity<C>();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) max_value = nan_max(max_value, load_as<C>(in[c]));
    max_value = block_reduce(max_value, shared, MaxOp{});
    C sum = C(0);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += dev_exp(load_as<C>(in[c]) - max_value);
    sum = block_reduce(sum, shared, SumOp{});
    const C lse = max_value + dev_log(sum);
    C sum_logp = C(0);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const S stored = store_as<S>(load_as<C>(in[c]) - lse);
      out[c] = stored;
      sum_logp += load_as<C>(stored);
    }
    sum_logp = block_reduce(sum_logp, shared, SumOp{});
    if (threadIdx.x == 0) {
      const int64_t label = static_cast<int64_t>(labels[r]);
      C logp_label = C(0);
      if (label >= 0 && label < cols) {
        logp_label = load_as<C>(store_as<S>(load_as<C>(in[label]) - lse));  // the value stored above
      } else if (bad_row) {
        atomicMin(reinterpret_cast<unsigned long long*>(bad_row), static_cast<unsigned long long>(r));
      }
      loss[r] = -on * logp_label - off * sum_logp;
    }
  }
}

template <typename S, typename L>
__global__ void cross_entropy_backward_kernel(const S* log_probs /* (rows, cols) */, const L* labels /* (rows) */,
                                              int64_t rows, int64_t cols, double smoothing, double scale,
                                              S* dlogits /* (rows, cols) */) {
  using C = compute_t<S>;
  const C on = C(1) - static_cast<C>(smoothing), off = static_cast<C>(smoothing) / static_cast<C>(cols);
  const C factor = static_cast<C>(scale);
  RT_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    const C target = off + (static_cast<int64_t>(labels[r]) == c ? on : C(0));
    dlogits[i] = store_as<S>(factor * (dev_exp(load_as<C>(log_probs[i])) - target));
  }
}

template <typename F>
void dispatch_labels(DType t, F&& f) {
  switch (t) {
    case DType::I32: f(Tag<int32_t>{}); return;
    case DType::I64: f(Tag<int64_t>{}); return;
    default: RT_THROW("op 'cross_entropy': labels must be i32 or i64, got ", dtype_name(t));
  }
}

void cross_entropy_cuda(const Tensor& logits, const Tensor& labels, double smoothing, Tensor& log_probs,
                        Tensor& loss, int64_t* bad_label) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  if (rows == 0) return;
  DeviceScope scope(logits);
  cudaStream_t stream = stream_now();
  // Row index of the first bad label, on the device: kNoBadRow until a block finds one.
  Tensor bad_row;
  int64_t* bad_row_ptr = nullptr;
  if (bad_label) {
    bad_row = Tensor::empty(Shape{1}, DType::I64, logits.device());
    bad_row_ptr = bad_row.data<int64_t>();
    fill_kernel<int64_t><<<1, 1, 0, stream>>>(bad_row_ptr, kNoBadRow, 1);
  }
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    RT_CHECK(loss.dtype() == (std::is_same_v<C, double> ? DType::F64 : DType::F32), "cross_entropy: loss ",
             loss.describe(), " has the wrong dtype for logits ", logits.describe());
    dispatch_labels(labels.dtype(), [&](auto label_tag) {
      using L = typename decltype(label_tag)::type;
      cross_entropy_kernel<S, L><<<grid_for(rows, 1), row_threads(cols), 0, stream>>>(
          logits.data<S>(), labels.data<L>(), rows, cols, smoothing, log_probs.data<S>(), loss.data<C>(),
          bad_row_ptr);
    });
  });
  if (bad_label) {
    int64_t host_bad_row = kNoBadRow;
    CUDA_CHECK(cudaMemcpyAsync(&host_bad_row, bad_row_ptr, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (host_bad_row != kNoBadRow) *bad_label = host_bad_row;
  }
}

void cross_entropy_backward_cuda(const Tensor& log_probs, const Tensor& labels, double smoothing, double scale,
                                 Tensor& dlogits) {
  const int64_t rows = log_probs.size(0), cols = log_probs.size(1);
  if (rows == 0 || cols == 0) return;
  RT_CHECK(dlogits.dtype() == log_probs.dtype(), "cross_entropy_backward: dlogits ", dlogits.describe(),
           " must have the dtype of log_probs ", log_probs.describe());
  DeviceScope scope(dlogits);
  dispatch_floating(log_probs.dtype(), "cross_entropy_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    dispatch_labels(labels.dtype(), [&](auto label_tag) {
      using L = typename decltype(label_tag)::type;
      cross_entropy_backward_kernel<S, L><<<grid_for(rows * cols), kThreads, 0, stream_now()>>>(
          log_probs.data<S>(), labels.data<L>(), rows, cols, smoothing, scale, dlogits.data<S>());
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// dropout, as the CPU: keep when u_i > p (compared in f32), m = keep ? 1/(1-p) : 0 in the compute type;
// mask = m stored in x's dtype, out = x * m (m unrounded).

template <typename S>
__global__ void dropout_kernel(const S* x /* (n) */, float threshold, compute_t<S> keep_scale, uint64_t seed,
                               uint64_t stream, S* out /* (n) */, S* mask /* (n) */, int64_t n) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, n) {
    const C m = philox_uniform(seed, stream, static_cast<uint64_t>(i)) > threshold ? keep_scale : C(0);
    mask[i] = store_as<S>(m);
    out[i] = store_as<S>(load_as<C>(x[i]) * m);
  }
}

void dropout_cuda(const Tensor& x, double p, uint64_t seed, uint64_t stream, Tensor& out, Tensor& mask) {
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using S = typename decltype(tag)::type;
    const compute_t<S> keep_scale = static_cast<compute_t<S>>(1.0 / (1.0 - p));
    dropout_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(x.data<S>(), static_cast<float>(p), keep_scale, seed,
                                                                  stream, out.data<S>(), mask.data<S>(), n);
  });
}

// ---------------------------------------------------------------------------------------------------
// after_op

bool sync_after_every_op() {
  static const bool sync = [] {
    const char* value = std::getenv("RINGTRAIN_CUDA_SYNC");
    return value != nullptr && std::string_view(value) == "1";
  }();
  return sync;
}

[[noreturn]] void raise_op_error(const char* op, cudaError_t status, bool synchronized) {
  const int device = cuda_detail::current_device_or_none();
  RT_THROW("CUDA error in op '", op, "': ", cudaGetErrorString(status), " (", cudaGetErrorName(status), ", code ",
           static_cast<int>(status), ") on ", device == detail::kNoDevice ? std::string("unknown device")
                                                                          : "cuda:" + std::to_string(device),
           synchronized ? " (found by synchronizing after the op because RINGTRAIN_CUDA_SYNC=1)"
                        : ". Kernels run asynchronously, so an earlier op may be the cause: rerun with "
                          "RINGTRAIN_CUDA_SYNC=1 to report each fault against the op that caused it");
}

void after_op_cuda(const char* op) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) raise_op_error(op, status, false);
  if (sync_after_every_op()) {
    status = cudaStreamSynchronize(stream_now());
    if (status == cudaSuccess) status = cudaGetLastError();
    if (status != cudaSuccess) raise_op_error(op, status, true);
  }
}

}  // namespace

const KernelTable* cuda_kernels() {
  static const KernelTable table = [] {
    KernelTable t;
    t.fill = &fill_cuda;
    t.convert = &convert_cuda;
    t.uniform = &uniform_cuda;
    t.normal = &normal_cuda;
    t.unary = &unary_cuda;
    t.binary = &binary_cuda;
    t.scalar = &scalar_cuda;
    t.reduce = &reduce_cuda;
    t.gemm = &gemm_cuda;
    t.softmax = &softmax_cuda;
    t.softmax_backward = &softmax_backward_cuda;
    t.cross_entropy = &cross_entropy_cuda;
    t.cross_entropy_backward = &cross_entropy_backward_cuda;
    t.dropout = &dropout_cuda;
    t.conv2d_forward = &cuda::conv2d_forward;
    t.conv2d_backward_data = &cuda::conv2d_backward_data;
    t.conv2d_backward_weights = &cuda::conv2d_backward_weights;
    t.batch_norm_forward = &cuda::batch_norm_forward;
    t.batch_norm_backward = &cuda::batch_norm_backward;
    t.max_pool2d_forward = &cuda::max_pool2d_forward;
    t.max_pool2d_backward = &cuda::max_pool2d_backward;
    t.avg_pool2d_forward = &cuda::avg_pool2d_forward;
    t.avg_pool2d_backward = &cuda::avg_pool2d_backward;
    t.sgd_multi_tensor = &cuda::sgd_multi_tensor;
    t.adamw_multi_tensor = &cuda::adamw_multi_tensor;
    t.unscale_multi_tensor = &cuda::unscale_multi_tensor;
    t.after_op = &after_op_cuda;
    return t;
  }();
  return &table;
}

}  // namespace ringtrain
