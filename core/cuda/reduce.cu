// core/cuda/reduce.cu: the CUDA sum / max reductions over x viewed as [outer, n, inner], deterministic:
// fixed-order tree reductions in work shapes chosen from the shape alone, no floating-point atomics.
// Semantics match the CPU kernel (core/cpu/reduce.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "core/cuda/common.cuh"
#include "core/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "core/kernels.h"
#include "core/tensor.h"

namespace ringtrain::cuda {
namespace {

// Launch helpers, dtype dispatch and device math: core/cuda/common.cuh.
using namespace cuda_common;

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
        } else if (max_better(values[row + s][lane], indices[row + s][lane], values[row][lane], indices[row][lane])) {
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
    reduce_serial_kernel<S, kOp>
        <<<grid_for(outputs), kThreads, 0, stream>>>(x.data<S>(), outer, n, inner, out.data<S>(), argmax);
    return;
  }
  // Strided loads waste little while inner is small; from 8 on, coalescing along inner wins.
  const bool columns = inner >= 8;
  const int64_t blocks_per_part = columns ? outer * ((inner + kColumnLanes - 1) / kColumnLanes) : outputs;
  // Split long rows when there are too few blocks to fill the GPU.
  constexpr int64_t kMinChunk = 8192, kTargetBlocks = 2048, kMaxParts = 1024;
  int64_t parts = std::min<int64_t>(
      {(n + kMinChunk - 1) / kMinChunk, std::max<int64_t>(1, kTargetBlocks / blocks_per_part), kMaxParts});
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
    reduce_segments_kernel<S, kOp><<<blocks, kThreads, 0, stream>>>(x.data<S>(), outer, n, inner, parts, chunk, out_ptr,
                                                                    argmax_ptr, partial_value_ptr, partial_index_ptr);
  }
  if (parts > 1) {
    reduce_partials_kernel<S, kOp><<<grid_for(outputs), kThreads, 0, stream>>>(partial_value_ptr, partial_index_ptr,
                                                                               outputs, parts, out.data<S>(), argmax);
  }
  // The partial buffers return to the caching allocator under this stream, so whatever reuses them is
  // ordered after the kernels above.
}

}  // namespace

void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out, Tensor* argmax) {
  const char* name = op == ReduceOp::Sum ? "sum" : "max";
  RT_CHECK(out.dtype() == x.dtype(), "op '", name, "': output ", out.describe(), " must have the dtype of ",
           x.describe());
  RT_CHECK(!argmax || !argmax->defined() || argmax->dtype() == DType::I64, "op '", name, "': argmax must be i64");
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  if (n == 0) {
    RT_CHECK(op == ReduceOp::Sum, "op 'max' of an empty dimension");
    fill(out, 0.0);
    return;
  }
  DeviceScope scope(out);
  int64_t* argmax_ptr = argmax && argmax->defined() ? argmax->data<int64_t>() : nullptr;
  dispatch_all(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (op == ReduceOp::Sum)
      launch_reduce<S, ReduceOp::Sum>(x, outer, n, inner, out, nullptr);
    else
      launch_reduce<S, ReduceOp::Max>(x, outer, n, inner, out, argmax_ptr);
  });
}

void register_reduce_kernels(KernelTable& t) { t.reduce = &reduce; }

}  // namespace ringtrain::cuda
