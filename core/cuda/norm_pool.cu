// core/cuda/norm_pool.cu: batch norm (with the fused residual add + ReLU) and max / average pooling over
// NHWC tensors on CUDA. Semantics are the KernelTable's (core/kernels.h) and follow the CPU kernels
// (core/cpu/norm_pool.cpp) step by step; every result is deterministic for a given shape.
//
// Batch norm views x as (M, C) with C innermost. Per-channel sums use a (kLanes x kRows) block: lanes
// along C (coalesced loads), rows of threads along M. Block (tile, part) covers channels
// [tile * kLanes, +kLanes) and rows [part * chunk, +chunk); each thread accumulates its rows in order (in
// f64, as the CPU does), the block combines its rows with a fixed tree and writes one partial per channel
// to an f64 workspace (parts, C). A second small kernel merges each channel's partials in a fixed order
// (again rows of threads over the parts and a fixed tree) and turns the sums into statistics. The split
// into parts depends on the shape alone, never on the GPU. Training uses two passes (mean, then the sum
// of squared deviations from its unrounded f64 value) like the CPU; the normalisation is a third,
// elementwise, pass. SyncBatchNorm's kernels (stats, apply with given statistics, the backward's local sums
// and its dx from sums over every replica) are the same passes cut where the replicas exchange numbers.
// Where C is a multiple of 16 bytes' worth of elements and the arrays are 16-byte aligned, every (M, C)
// pass has a vector path (a thread moves 8 channels of a 16-bit row per load; the same arithmetic per
// element). BN + ReLU without a residual has a fused backward that recomputes the ReLU's mask from x with
// the forward's rounding, so y is not kept and dy is not masked in a pass of its own.
//
// Pooling: one thread per output element (c innermost, so loads and stores are coalesced). Backward
// passes are gathers, one thread per input element, that visit the outputs whose window covers it in
// increasing output order, the order in which the CPU scatters: no atomics, and the same sums.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/cuda/common.cuh"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "core/kernels.h"
#include "core/tensor.h"

namespace ringtrain::cuda {
namespace {

using namespace cuda_common;

constexpr int kLanes = 32;                // channels per block (threadIdx.x)
constexpr int kRows = kThreads / kLanes;  // rows of threads per block (threadIdx.y); a power of 2

// gamma, beta and all statistics: f64 for f64 inputs, else f32.
template <typename S>
using param_t = std::conditional_t<std::is_same_v<S, double>, double, float>;

// Rounded arithmetic that the compiler may not contract into FMAs, so that elementwise results match the
// CPU's separately rounded products and sums.
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ inline float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ inline double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ inline float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline double div_rn(double a, double b) { return __ddiv_rn(a, b); }

// ---------------------------------------------------------------------------------------------------
// Batch norm: per-channel partial sums

// Rows of (M, C) per part: enough parts to give the GPU ~kTargetBlocks blocks, each at least kMinChunk
// rows. A function of (M, C) only, so the summation order never depends on the device.
struct RowSplit {
  int64_t parts = 1, chunk = 1;
};

RowSplit split_rows_over(int64_t rows, int64_t tiles) {
  constexpr int64_t kMinChunk = 256, kTargetBlocks = 2048, kMaxParts = 1024;
  RowSplit split;
  split.parts = std::max<int64_t>(1, std::min<int64_t>({(rows + kMinChunk - 1) / kMinChunk,
                                                        std::max<int64_t>(1, kTargetBlocks / tiles), kMaxParts}));
  split.chunk = std::max<int64_t>(1, (rows + split.parts - 1) / split.parts);
  split.parts = std::max<int64_t>(1, (rows + split.chunk - 1) / split.chunk);  // no empty parts
  return split;
}

RowSplit split_rows(int64_t rows, int64_t channels) { return split_rows_over(rows, (channels + kLanes - 1) / kLanes); }

// The forward's ReLU mask, recomputed from x: y = store(x * scale + shift) as bn_apply_kernel rounds it,
// then y > 0 (relu_coef: the forward's scale (C), shift (C); null: no mask). dy where the forward's ReLU
// passed its input, else 0: the mask of relu's own backward, bit for bit.
template <typename S, typename A>
__device__ inline A relu_masked_dy(A g, S x, const A* relu_coef, int64_t C, int64_t c) {
  if (!relu_coef) return g;
  const S y = store_as<S>(add_rn(mul_rn(load_as<A>(x), relu_coef[c]), relu_coef[C + c]));
  return load_as<A>(y) > A(0) ? g : A(0);
}

enum class StatPass {
  Sum,               // sum x                                  -> 1 accumulator
  SquaredDeviation,  // sum (x - mean)^2                       -> 1 accumulator
  Backward,          // sum dy, sum dy * (x - mean) * invstd   -> 2 accumulators
};

// Fixed-order tree over the kRows rows of a (kLanes, kRows) block; row 0 ends with the totals. Every
// thread of the block must call it.
__device__ inline void tree_over_rows(double (*shared)[kLanes]) {
  const unsigned lane = threadIdx.x, row = threadIdx.y;
  for (unsigned s = kRows / 2; s > 0; s >>= 1) {
    if (row < s) shared[row][lane] += shared[row + s][lane];
    __syncthreads();
  }
}

// Grid (tiles, parts), block (kLanes, kRows). Writes partial[(a * parts + part) * C + c] for accumulator a.
template <typename S, StatPass kPass>
__global__ void __launch_bounds__(kThreads)
    channel_partials_kernel(const S* x /* (M, C) */, const S* dy /* (M, C), Backward only */,
                            const param_t<S>* mean /* (C), Backward only */,
                            const param_t<S>* invstd /* (C), Backward only */,
                            const double* mean64 /* (C), SquaredDeviation only: the f64 mean */,
                            const compute_t<S>* relu_coef /* (2, C) or null, Backward only */, int64_t M, int64_t C,
                            int64_t chunk, double* partial /* (accumulators, parts, C) */) {
  using A = compute_t<S>;
  __shared__ double acc0[kRows][kLanes];
  __shared__ double acc1[kRows][kLanes];
  const unsigned lane = threadIdx.x, row = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes + lane;
  const int64_t part = blockIdx.y;
  double a0 = 0.0, a1 = 0.0;
  if (c < C) {
    double m = 0.0, is = 0.0;
    if constexpr (kPass == StatPass::SquaredDeviation) m = mean64[c];
    if constexpr (kPass == StatPass::Backward) {
      m = static_cast<double>(mean[c]);
      is = static_cast<double>(invstd[c]);
    }
    const int64_t begin = part * chunk, end = min(M, begin + chunk);
    for (int64_t r = begin + row; r < end; r += kRows) {
      const double v = static_cast<double>(load_as<A>(x[r * C + c]));
      if constexpr (kPass == StatPass::Sum) {
        a0 += v;
      } else if constexpr (kPass == StatPass::SquaredDeviation) {
        const double d = v - m;
        a0 += d * d;
      } else {
        const double g =
            static_cast<double>(relu_masked_dy<S, A>(load_as<A>(dy[r * C + c]), x[r * C + c], relu_coef, C, c));
        a0 += g;
        a1 += g * ((v - m) * is);
      }
    }
  }
  acc0[row][lane] = a0;
  if constexpr (kPass == StatPass::Backward) acc1[row][lane] = a1;
  __syncthreads();
  tree_over_rows(acc0);
  if constexpr (kPass == StatPass::Backward) tree_over_rows(acc1);
  if (row == 0 && c < C) {
    partial[part * C + c] = acc0[0][lane];
    if constexpr (kPass == StatPass::Backward) partial[(gridDim.y + part) * C + c] = acc1[0][lane];
  }
}

// Channel c's total over its `parts` partials (partial: (parts, C)): row `row` of the block adds parts
// row, row + kRows, ... in order, then a fixed tree over the rows. Every thread of a (kLanes, kRows) block
// must call it; every thread gets the result (meaningful where c < C).
__device__ double merge_parts(const double* partial, int64_t parts, int64_t C, int64_t c, double (*shared)[kLanes]) {
  const unsigned lane = threadIdx.x, row = threadIdx.y;
  double acc = 0.0;
  if (c < C)
    for (int64_t p = row; p < parts; p += kRows) acc += partial[p * C + c];
  shared[row][lane] = acc;
  __syncthreads();
  tree_over_rows(shared);
  const double total = shared[0][lane];
  __syncthreads();  // shared may be reused right away
  return total;
}

// y = x * scale + shift with scale = gamma * invstd and shift = beta - mean * gamma * invstd, computed in
// the parameter type and rounded as the CPU does.
template <typename P, typename A>
__device__ inline void write_scale_shift(const P* gamma, const P* beta, P mean, P invstd, int64_t C, int64_t c,
                                         A* coef /* scale (C), shift (C) */) {
  coef[c] = static_cast<A>(mul_rn(gamma[c], invstd));
  coef[C + c] = static_cast<A>(sub_rn(beta[c], mul_rn(mul_rn(mean, gamma[c]), invstd)));
}

// Grid (tiles), block (kLanes, kRows).
template <typename P>
__global__ void __launch_bounds__(kThreads)
    bn_mean_kernel(const double* partial /* (parts, C) */, int64_t parts, int64_t M, int64_t C, P* save_mean /* (C) */,
                   double* mean64 /* (C): the same, unrounded, for the second pass */) {
  __shared__ double shared[kRows][kLanes];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x;
  const double total = merge_parts(partial, parts, C, c, shared);
  if (threadIdx.y == 0 && c < C) {
    const double mean = M > 0 ? total / static_cast<double>(M) : 0.0;
    save_mean[c] = static_cast<P>(mean);
    mean64[c] = mean;
  }
}

// SyncBatchNorm's local statistics: stats = [count, mean (C), M2 (C)] in f64. Grid (tiles), block
// (kLanes, kRows). With `mean_pass` the partials are sums of x (-> mean and the count), else squared
// deviations from that mean (-> M2).
__global__ void __launch_bounds__(kThreads)
    bn_stats_kernel(const double* partial /* (parts, C) */, int64_t parts, int64_t M, int64_t C, bool mean_pass,
                    double* stats /* (2C + 1) */) {
  __shared__ double shared[kRows][kLanes];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x;
  const double total = merge_parts(partial, parts, C, c, shared);
  if (threadIdx.y != 0 || c >= C) return;
  if (mean_pass) {
    stats[1 + c] = M > 0 ? total / static_cast<double>(M) : 0.0;
    if (c == 0) stats[0] = static_cast<double>(M);
  } else {
    stats[1 + C + c] = total;
  }
}

// The scale and shift of given statistics (batch_norm_apply). One thread per channel.
template <typename P, typename A>
__global__ void bn_given_params_kernel(const P* mean, const P* invstd, const P* gamma, const P* beta, int64_t C,
                                       A* coef /* scale (C), shift (C) */) {
  RT_GRID_STRIDE(c, C) write_scale_shift(gamma, beta, mean[c], invstd[c], C, c, coef);
}

// The local sums of the backward into sums = [sum dy (C), sum dy * xhat (C)]. Grid (tiles), block
// (kLanes, kRows).
__global__ void __launch_bounds__(kThreads) bn_backward_sums_kernel(const double* partial /* (2, parts, C) */,
                                                                    int64_t parts, int64_t C, double* sums /* (2C) */) {
  __shared__ double shared[kRows][kLanes];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x;
  const double sum_dy = merge_parts(partial, parts, C, c, shared);
  const double sum_dy_xhat = merge_parts(partial + parts * C, parts, C, c, shared);
  if (threadIdx.y == 0 && c < C) {
    sums[c] = sum_dy;
    sums[C + c] = sum_dy_xhat;
  }
}

// The dx coefficients of batch_norm_backward_elemt from sums over every replica (see bn_backward_coef_kernel).
template <typename P, typename A>
__global__ void bn_elemt_coef_kernel(const double* sums /* (2C) */, double count, const P* gamma, const P* save_invstd,
                                     int64_t C, A* coef /* k1, k2, k3: (3, C) */) {
  RT_GRID_STRIDE(c, C) {
    const double gi = static_cast<double>(gamma[c]) * static_cast<double>(save_invstd[c]);
    coef[c] = static_cast<A>(gi);
    coef[C + c] = static_cast<A>(gi * sums[c] / count);
    coef[2 * C + c] = static_cast<A>(gi * sums[C + c] / count);
  }
}

// Grid (tiles), block (kLanes, kRows).
template <typename P, typename A>
__global__ void __launch_bounds__(kThreads)
    bn_invstd_kernel(const double* partial /* (parts, C): squared deviations */, int64_t parts, int64_t M, int64_t C,
                     double eps, const P* gamma, const P* beta, const P* save_mean, P* save_invstd,
                     A* coef /* scale (C), shift (C) */) {
  __shared__ double shared[kRows][kLanes];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x;
  const double total = merge_parts(partial, parts, C, c, shared);
  if (threadIdx.y == 0 && c < C) {
    const P invstd = static_cast<P>(1.0 / sqrt(total / static_cast<double>(M) + eps));
    save_invstd[c] = invstd;
    write_scale_shift(gamma, beta, save_mean[c], invstd, C, c, coef);
  }
}

// Eval: the saved statistics come from the running ones. One thread per channel.
template <typename P, typename A>
__global__ void bn_eval_params_kernel(const P* running_mean, const P* running_var, double eps, const P* gamma,
                                      const P* beta, int64_t C, P* save_mean, P* save_invstd,
                                      A* coef /* scale (C), shift (C) */) {
  RT_GRID_STRIDE(c, C) {
    const P mean = running_mean[c];
    const P invstd = static_cast<P>(1.0 / sqrt(static_cast<double>(running_var[c]) + eps));
    save_mean[c] = mean;
    save_invstd[c] = invstd;
    write_scale_shift(gamma, beta, mean, invstd, C, c, coef);
  }
}

// Grid (tiles, row blocks), block (kLanes, kRows); rows grid-strided along y.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    bn_apply_kernel(const S* x /* (M, C) */, const S* residual /* (M, C) or null */,
                    const compute_t<S>* coef /* scale (C), shift (C) */, int64_t M, int64_t C, bool relu,
                    S* y /* (M, C) */) {
  using A = compute_t<S>;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x;
  if (c >= C) return;
  const A scale = coef[c], shift = coef[C + c];
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kRows;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRows + threadIdx.y; r < M; r += stride) {
    const int64_t i = r * C + c;
    A v = add_rn(mul_rn(load_as<A>(x[i]), scale), shift);
    if (residual) v = add_rn(v, load_as<A>(residual[i]));
    if (relu && v < A(0)) v = A(0);  // NaN stays NaN, as on the CPU
    y[i] = store_as<S>(v);
  }
}

// Backward: dgamma, dbeta and the dx coefficients k1 = gamma * invstd, k2 = k1 * mean(dy),
// k3 = k1 * mean(dy * xhat) (k2 = k3 = 0 in eval). Grid (tiles), block (kLanes, kRows).
template <typename P, typename A>
__global__ void __launch_bounds__(kThreads)
    bn_backward_coef_kernel(const double* partial /* (2, parts, C): sum dy, sum dy * xhat */, int64_t parts, int64_t M,
                            int64_t C, bool training, const P* gamma, const P* save_invstd, P* dgamma, P* dbeta,
                            A* coef /* k1, k2, k3: (3, C) */) {
  __shared__ double shared[kRows][kLanes];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x;
  const double sum_dy = merge_parts(partial, parts, C, c, shared);
  const double sum_dy_xhat = merge_parts(partial + parts * C, parts, C, c, shared);
  if (threadIdx.y == 0 && c < C) {
    dgamma[c] = static_cast<P>(sum_dy_xhat);
    dbeta[c] = static_cast<P>(sum_dy);
    const double gi = static_cast<double>(gamma[c]) * static_cast<double>(save_invstd[c]);
    const double m = static_cast<double>(M);
    coef[c] = static_cast<A>(gi);
    coef[C + c] = static_cast<A>(training ? gi * sum_dy / m : 0.0);
    coef[2 * C + c] = static_cast<A>(training ? gi * sum_dy_xhat / m : 0.0);
  }
}

// dx = dy * k1 - k2 - xhat * k3. Grid (tiles, row blocks), block (kLanes, kRows).
template <typename S>
__global__ void __launch_bounds__(kThreads)
    bn_backward_dx_kernel(const S* x /* (M, C) */, const S* dy /* (M, C) */, const param_t<S>* save_mean,
                          const param_t<S>* save_invstd, const compute_t<S>* coef /* (3, C) */,
                          const compute_t<S>* relu_coef /* (2, C) or null */, int64_t M, int64_t C,
                          S* dx /* (M, C) */) {
  using A = compute_t<S>;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x;
  if (c >= C) return;
  const A mean = static_cast<A>(save_mean[c]), invstd = static_cast<A>(save_invstd[c]);
  const A k1 = coef[c], k2 = coef[C + c], k3 = coef[2 * C + c];
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kRows;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRows + threadIdx.y; r < M; r += stride) {
    const int64_t i = r * C + c;
    const A xhat = mul_rn(sub_rn(load_as<A>(x[i]), mean), invstd);
    const A g = relu_masked_dy<S, A>(load_as<A>(dy[i]), x[i], relu_coef, C, c);
    dx[i] = store_as<S>(sub_rn(sub_rn(mul_rn(g, k1), k2), mul_rn(xhat, k3)));
  }
}

// ---------------------------------------------------------------------------------------------------
// Batch norm's vector paths: where C is a multiple of kVec<S> and every (M, C) array is 16-byte aligned,
// a thread moves kVec<S> consecutive channels of a row per load (8 for the 16-bit types). The arithmetic
// per element is the scalar kernels' own; only the partial sums' order differs (the block's shape).

// The partial sums (as channel_partials_kernel, same workspace layout). Grid (tiles, parts), block
// (lanes, rows) with lanes * rows = kThreads, lanes a power of 2; thread (lane, row) covers channels
// [(tile * lanes + lane) * V, +V) and rows begin + row, begin + row + rows, ... of its part.
template <typename S, StatPass kPass>
__global__ void __launch_bounds__(kThreads)
    channel_partials_vec_kernel(const S* x /* (M, C) */, const S* dy /* (M, C), Backward only */,
                                const param_t<S>* mean /* (C), Backward only */,
                                const param_t<S>* invstd /* (C), Backward only */,
                                const double* mean64 /* (C), SquaredDeviation only */,
                                const compute_t<S>* relu_coef /* (2, C) or null, Backward only */, int64_t M, int64_t C,
                                int64_t chunk, double* partial /* (accumulators, parts, C) */) {
  using A = compute_t<S>;
  constexpr int V = kVec<S>;
  constexpr int kAcc = kPass == StatPass::Backward ? 2 : 1;
  __shared__ double shared[kAcc][kThreads * V];
  const unsigned lane = threadIdx.x, row = threadIdx.y, lanes = blockDim.x, rows = blockDim.y;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * lanes + lane, c0 = group * V;
  const int64_t part = blockIdx.y;
  double a0[V], a1[V];
#pragma unroll
  for (int k = 0; k < V; ++k) a0[k] = a1[k] = 0.0;
  if (c0 < C) {
    double m[V], is[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      m[k] = 0.0;
      is[k] = 0.0;
      if constexpr (kPass == StatPass::SquaredDeviation) m[k] = mean64[c0 + k];
      if constexpr (kPass == StatPass::Backward) {
        m[k] = static_cast<double>(mean[c0 + k]);
        is[k] = static_cast<double>(invstd[c0 + k]);
      }
    }
    const int64_t begin = part * chunk, end = min(M, begin + chunk);
    for (int64_t r = begin + row; r < end; r += rows) {
      const Vec<S> xv = *reinterpret_cast<const Vec<S>*>(x + r * C + c0);
      Vec<S> gv;
      if constexpr (kPass == StatPass::Backward) gv = *reinterpret_cast<const Vec<S>*>(dy + r * C + c0);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const double v = static_cast<double>(load_as<A>(xv.v[k]));
        if constexpr (kPass == StatPass::Sum) {
          a0[k] += v;
        } else if constexpr (kPass == StatPass::SquaredDeviation) {
          const double d = v - m[k];
          a0[k] += d * d;
        } else {
          const double g =
              static_cast<double>(relu_masked_dy<S, A>(load_as<A>(gv.v[k]), xv.v[k], relu_coef, C, c0 + k));
          a0[k] += g;
          a1[k] += g * ((v - m[k]) * is[k]);
        }
      }
    }
  }
  // A fixed tree over the block's rows; row 0 ends with the totals. Element k of thread t sits at
  // k * kThreads + t, so a warp's accesses are consecutive.
  const unsigned at = row * lanes + lane;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    shared[0][k * kThreads + at] = a0[k];
    if constexpr (kAcc == 2) shared[kAcc - 1][k * kThreads + at] = a1[k];
  }
  __syncthreads();
  for (unsigned s = rows / 2; s > 0; s >>= 1) {
    if (row < s) {
      const unsigned from = at + s * lanes;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        shared[0][k * kThreads + at] += shared[0][k * kThreads + from];
        if constexpr (kAcc == 2) shared[kAcc - 1][k * kThreads + at] += shared[kAcc - 1][k * kThreads + from];
      }
    }
    __syncthreads();
  }
  if (row == 0 && c0 < C) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      partial[part * C + c0 + k] = shared[0][k * kThreads + at];
      if constexpr (kAcc == 2) partial[(gridDim.y + part) * C + c0 + k] = shared[kAcc - 1][k * kThreads + at];
    }
  }
}

// Lanes of a vector pass's block over C / V channel groups: a power of 2 covering them, up to 32; the rest
// of the block's kThreads are rows.
unsigned vec_lanes(int64_t groups) {
  unsigned lanes = 1;
  while (lanes < 32 && lanes < groups) lanes *= 2;
  return lanes;
}

// The element-wise vector passes' block: lanes over channel groups (a power of 2, up to 32), rows of
// threads over rows; each thread keeps its V channels' coefficients in registers for all its rows.
// Grid (tiles, row blocks), rows grid-strided along y.
template <typename S>
struct VecPass {
  dim3 grid, block;
  VecPass(int64_t M, int64_t C) {
    const int64_t groups = C / kVec<S>;
    const unsigned lanes = vec_lanes(groups), rows = kThreads / lanes;
    constexpr int64_t kRowsPerThread = 4;
    const int64_t row_blocks = std::clamp<int64_t>((M + rows * kRowsPerThread - 1) / (rows * kRowsPerThread), 1, 65535);
    grid = dim3(static_cast<unsigned>((groups + lanes - 1) / lanes), static_cast<unsigned>(row_blocks));
    block = dim3(lanes, rows);
  }
};

// bn_apply_kernel's vector path. Grid and block: VecPass.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    bn_apply_vec_kernel(const S* x /* (M, C) */, const S* residual /* (M, C) or null */,
                        const compute_t<S>* coef /* scale (C), shift (C) */, int64_t M, int64_t C, bool relu,
                        S* y /* (M, C) */) {
  using A = compute_t<S>;
  constexpr int V = kVec<S>;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c0 >= C) return;
  A scale[V], shift[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    scale[k] = coef[c0 + k];
    shift[k] = coef[C + c0 + k];
  }
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < M; r += stride) {
    const int64_t at = r * C + c0;
    const Vec<S> a = *reinterpret_cast<const Vec<S>*>(x + at);
    Vec<S> res, out;
    if (residual) res = *reinterpret_cast<const Vec<S>*>(residual + at);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A v = add_rn(mul_rn(load_as<A>(a.v[k]), scale[k]), shift[k]);
      if (residual) v = add_rn(v, load_as<A>(res.v[k]));
      if (relu && v < A(0)) v = A(0);
      out.v[k] = store_as<S>(v);
    }
    *reinterpret_cast<Vec<S>*>(y + at) = out;
  }
}

// bn_backward_dx_kernel's vector path. Grid and block: VecPass.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    bn_backward_dx_vec_kernel(const S* x /* (M, C) */, const S* dy /* (M, C) */, const param_t<S>* save_mean,
                              const param_t<S>* save_invstd, const compute_t<S>* coef /* (3, C) */,
                              const compute_t<S>* relu_coef /* (2, C) or null */, int64_t M, int64_t C,
                              S* dx /* (M, C) */) {
  using A = compute_t<S>;
  constexpr int V = kVec<S>;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c0 >= C) return;
  A mean[V], invstd[V], k1[V], k2[V], k3[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    mean[k] = static_cast<A>(save_mean[c0 + k]);
    invstd[k] = static_cast<A>(save_invstd[c0 + k]);
    k1[k] = coef[c0 + k];
    k2[k] = coef[C + c0 + k];
    k3[k] = coef[2 * C + c0 + k];
  }
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < M; r += stride) {
    const int64_t at = r * C + c0;
    const Vec<S> a = *reinterpret_cast<const Vec<S>*>(x + at);
    const Vec<S> g = *reinterpret_cast<const Vec<S>*>(dy + at);
    Vec<S> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A xhat = mul_rn(sub_rn(load_as<A>(a.v[k]), mean[k]), invstd[k]);
      const A gk = relu_masked_dy<S, A>(load_as<A>(g.v[k]), a.v[k], relu_coef, C, c0 + k);
      out.v[k] = store_as<S>(sub_rn(sub_rn(mul_rn(gk, k1[k]), k2[k]), mul_rn(xhat, k3[k])));
    }
    *reinterpret_cast<Vec<S>*>(dx + at) = out;
  }
}

// Whether the vector paths take an (M, C) pass: C a multiple of kVec<S>, every array 16-byte aligned.
template <typename S, typename... P>
bool use_vec(int64_t C, const P*... arrays) {
  return kVec<S> > 1 && C % kVec<S> == 0 && all_aligned16(arrays...);
}

// The partial-sum passes over one (M, C) array: the vector kernel where use_vec allows, else the scalar
// one; the shape (and with it the order of every sum) depends on (M, C), the dtype and the alignment only.
// Tensors the kernels make are 16-byte aligned, so two passes over equal data agree bit for bit unless
// one is handed a view that starts mid-row (the one-replica SyncBatchNorm == BatchNorm promise too).
template <typename S>
struct Partials {
  bool vec = false;
  dim3 grid, block;
  RowSplit split;

  Partials(int64_t M, int64_t C, const S* x, const S* dy) : vec(use_vec<S>(C, x, dy)) {
    if (vec) {  // channel_partials_vec_kernel's block: lanes over channel groups, rows
      const int64_t groups = C / kVec<S>;
      const unsigned lanes = vec_lanes(groups);
      const int64_t tiles = (groups + lanes - 1) / lanes;
      split = split_rows_over(M, tiles);
      grid = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(split.parts));
      block = dim3(lanes, kThreads / lanes);
    } else {
      split = split_rows(M, C);
      grid = dim3(static_cast<unsigned>((C + kLanes - 1) / kLanes), static_cast<unsigned>(split.parts));
      block = dim3(kLanes, kRows);
    }
  }

  template <StatPass kPass>
  void launch(cudaStream_t stream, const S* x, const S* dy, const param_t<S>* mean, const param_t<S>* invstd,
              const double* mean64, const compute_t<S>* relu_coef, int64_t M, int64_t C, double* ws) const {
    if (vec)
      channel_partials_vec_kernel<S, kPass>
          <<<grid, block, 0, stream>>>(x, dy, mean, invstd, mean64, relu_coef, M, C, split.chunk, ws);
    else
      channel_partials_kernel<S, kPass>
          <<<grid, block, 0, stream>>>(x, dy, mean, invstd, mean64, relu_coef, M, C, split.chunk, ws);
    CUDA_CHECK(cudaGetLastError());
  }
};

// Grid for the elementwise (M, C) passes: a few rows per thread, grid-strided beyond 65535 row blocks.
dim3 elementwise_grid(int64_t M, int64_t C) {
  constexpr int64_t kRowsPerThread = 4;
  const int64_t tiles = (C + kLanes - 1) / kLanes;
  const int64_t row_blocks = std::clamp<int64_t>((M + kRows * kRowsPerThread - 1) / (kRows * kRowsPerThread), 1, 65535);
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(row_blocks));
}

// The running statistics' update (KernelTable::batch_norm_update_running), rounded as the element-wise ops
// that spell it out: the scalars converted to P on the host as the scalar kernels convert them.
template <typename P>
__global__ void bn_update_running_kernel(const P* mean, const P* invstd, P neg_eps, P keep, P momentum, P var_weight,
                                         int64_t C, P* running_mean, P* running_var) {
  RT_GRID_STRIDE(c, C) {
    const P var = add_rn(div_rn(P(1), mul_rn(invstd[c], invstd[c])), neg_eps);
    running_mean[c] = add_rn(mul_rn(running_mean[c], keep), mul_rn(mean[c], momentum));
    running_var[c] = add_rn(mul_rn(running_var[c], keep), mul_rn(var, var_weight));
  }
}

// y = bn(x) (+ residual, ReLU) with the per-channel scale and shift in coef.
template <typename S>
void launch_apply(cudaStream_t stream, const S* x, const S* residual, const compute_t<S>* coef, int64_t M, int64_t C,
                  bool relu, S* y) {
  if (use_vec<S>(C, x, residual, y)) {
    const VecPass<S> pass(M, C);
    bn_apply_vec_kernel<S><<<pass.grid, pass.block, 0, stream>>>(x, residual, coef, M, C, relu, y);
  } else {
    bn_apply_kernel<S><<<elementwise_grid(M, C), dim3(kLanes, kRows), 0, stream>>>(x, residual, coef, M, C, relu, y);
  }
  CUDA_CHECK(cudaGetLastError());
}

// dx from the coefficients k1, k2, k3 (and the recomputed ReLU mask where relu_coef is set).
template <typename S>
void launch_dx(cudaStream_t stream, const S* x, const S* dy, const param_t<S>* mean, const param_t<S>* invstd,
               const compute_t<S>* coef, const compute_t<S>* relu_coef, int64_t M, int64_t C, S* dx) {
  if (use_vec<S>(C, x, dy, dx)) {
    const VecPass<S> pass(M, C);
    bn_backward_dx_vec_kernel<S><<<pass.grid, pass.block, 0, stream>>>(x, dy, mean, invstd, coef, relu_coef, M, C, dx);
  } else {
    bn_backward_dx_kernel<S>
        <<<elementwise_grid(M, C), dim3(kLanes, kRows), 0, stream>>>(x, dy, mean, invstd, coef, relu_coef, M, C, dx);
  }
  CUDA_CHECK(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------------
// Pooling

// The pooling geometry in index type I: int32_t where every index of the pass fits (the common case;
// 64-bit division and modulo cost several times as much), else int64_t.
template <typename I>
struct PoolGeometry {
  I n, h, w, c, r, s, p, q, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  explicit PoolGeometry(const ConvGeometry& g)
      : n(static_cast<I>(g.n)),
        h(static_cast<I>(g.h)),
        w(static_cast<I>(g.w)),
        c(static_cast<I>(g.c)),
        r(static_cast<I>(g.r)),
        s(static_cast<I>(g.s)),
        p(static_cast<I>(g.p)),
        q(static_cast<I>(g.q)),
        stride_h(static_cast<I>(g.stride_h)),
        stride_w(static_cast<I>(g.stride_w)),
        pad_h(static_cast<I>(g.pad_h)),
        pad_w(static_cast<I>(g.pad_w)),
        dilation_h(static_cast<I>(g.dilation_h)),
        dilation_w(static_cast<I>(g.dilation_w)) {}
};

// Whether every index of a pool pass over g (inputs, outputs, window positions) fits in int32_t.
bool pool_fits_int32(const ConvGeometry& g) {
  constexpr int64_t kLimit = int64_t{1} << 30;  // headroom for the window arithmetic's sums
  return g.n * g.h * g.w * g.c < kLimit && g.n * g.p * g.q * g.c < kLimit &&
         g.h + g.pad_h + g.r * g.dilation_h < kLimit && g.w + g.pad_w + g.s * g.dilation_w < kLimit &&
         g.stride_h < kLimit && g.stride_w < kLimit;
}

// Index decomposition of an NHWC offset: o = ((n * d1 + i1) * d2 + i2) * C + c.
template <typename I>
struct Nhwc {
  I n, i1, i2, c;
};
template <typename I>
__device__ inline Nhwc<I> decompose(I o, I d1, I d2, I C) {
  Nhwc<I> r;
  r.c = o % C;
  I t = o / C;
  r.i2 = t % d2;
  t /= d2;
  r.i1 = t % d1;
  r.n = t / d1;
  return r;
}

// The first output index whose window [o * stride - pad, ...) reaches position `reach` = pos + pad - extent + 1
// (i.e. the smallest o with o * stride >= reach), at least 0.
template <typename I>
__device__ inline I first_window(I reach, I stride) {
  return reach <= 0 ? 0 : (reach + stride - 1) / stride;
}

template <typename S, typename I>
__global__ void max_pool_forward_kernel(const S* x /* (N, H, W, C) */, PoolGeometry<I> g, I total,
                                        S* y /* (N, P, Q, C) */, int64_t* argmax /* (N, P, Q, C) */) {
  using A = compute_t<S>;
  RT_GRID_STRIDE_AS(I, o, total) {
    const Nhwc<I> at = decompose(o, g.p, g.q, g.c);
    A best = dev_neg_infinity<A>();
    I where = -1;
    for (I r = 0; r < g.r; ++r) {
      const I h = at.i1 * g.stride_h - g.pad_h + r * g.dilation_h;
      if (h < 0 || h >= g.h) continue;
      for (I s = 0; s < g.s; ++s) {
        const I w = at.i2 * g.stride_w - g.pad_w + s * g.dilation_w;
        if (w < 0 || w >= g.w) continue;
        const A v = load_as<A>(x[((at.n * g.h + h) * g.w + w) * g.c + at.c]);
        // The first element seen always wins (padding never does); then NaN propagates, else the first
        // maximum stays.
        if (where < 0 || v > best || (dev_isnan(v) && !dev_isnan(best))) {
          best = v;
          where = h * g.w + w;
        }
      }
    }
    y[o] = store_as<S>(best);
    argmax[o] = where;
  }
}

// One thread per input element: sums dy over the outputs (in increasing order) whose argmax is this element.
template <typename S, typename I>
__global__ void max_pool_backward_kernel(const S* dy /* (N, P, Q, C) */, const int64_t* argmax /* (N, P, Q, C) */,
                                         PoolGeometry<I> g, I total, S* dx /* (N, H, W, C) */) {
  using A = compute_t<S>;
  RT_GRID_STRIDE_AS(I, i, total) {
    const Nhwc<I> at = decompose(i, g.h, g.w, g.c);
    const int64_t target = at.i1 * g.w + at.i2;
    const I p_lo = first_window<I>(at.i1 + g.pad_h - (g.r - 1) * g.dilation_h, g.stride_h);
    const I p_hi = min(g.p - 1, (at.i1 + g.pad_h) / g.stride_h);
    const I q_lo = first_window<I>(at.i2 + g.pad_w - (g.s - 1) * g.dilation_w, g.stride_w);
    const I q_hi = min(g.q - 1, (at.i2 + g.pad_w) / g.stride_w);
    A acc = A(0);
    for (I p = p_lo; p <= p_hi; ++p)
      for (I q = q_lo; q <= q_hi; ++q) {
        const I o = ((at.n * g.p + p) * g.q + q) * g.c + at.c;
        if (argmax[o] == target) acc += load_as<A>(dy[o]);
      }
    dx[i] = store_as<S>(acc);
  }
}

// count_include_pad: the sum over the in-bounds part of the window times 1 / (r * s). Dilation is not
// applied (as on the CPU; pooling geometry always has dilation 1).
template <typename S, typename I>
__global__ void avg_pool_forward_kernel(const S* x /* (N, H, W, C) */, PoolGeometry<I> g, compute_t<S> inv, I total,
                                        S* y /* (N, P, Q, C) */) {
  using A = compute_t<S>;
  RT_GRID_STRIDE_AS(I, o, total) {
    const Nhwc<I> at = decompose(o, g.p, g.q, g.c);
    A acc = A(0);
    for (I r = 0; r < g.r; ++r) {
      const I h = at.i1 * g.stride_h - g.pad_h + r;
      if (h < 0 || h >= g.h) continue;
      for (I s = 0; s < g.s; ++s) {
        const I w = at.i2 * g.stride_w - g.pad_w + s;
        if (w < 0 || w >= g.w) continue;
        acc += load_as<A>(x[((at.n * g.h + h) * g.w + w) * g.c + at.c]);
      }
    }
    y[o] = store_as<S>(mul_rn(acc, inv));
  }
}

// One thread per input element: sums dy * inv over the windows covering it, in increasing output order.
template <typename S, typename I>
__global__ void avg_pool_backward_kernel(const S* dy /* (N, P, Q, C) */, PoolGeometry<I> g, compute_t<S> inv, I total,
                                         S* dx /* (N, H, W, C) */) {
  using A = compute_t<S>;
  RT_GRID_STRIDE_AS(I, i, total) {
    const Nhwc<I> at = decompose(i, g.h, g.w, g.c);
    const I p_lo = first_window<I>(at.i1 + g.pad_h - (g.r - 1), g.stride_h);
    const I p_hi = min(g.p - 1, (at.i1 + g.pad_h) / g.stride_h);
    const I q_lo = first_window<I>(at.i2 + g.pad_w - (g.s - 1), g.stride_w);
    const I q_hi = min(g.q - 1, (at.i2 + g.pad_w) / g.stride_w);
    A acc = A(0);
    for (I p = p_lo; p <= p_hi; ++p)
      for (I q = q_lo; q <= q_hi; ++q)
        acc = add_rn(acc, mul_rn(load_as<A>(dy[((at.n * g.p + p) * g.q + q) * g.c + at.c]), inv));
    dx[i] = store_as<S>(acc);
  }
}

// Calls f(int32_t{}) where every index of a pool pass over g fits in 32 bits, else f(int64_t{}).
template <typename F>
void with_pool_index(const ConvGeometry& g, F&& f) {
  if (pool_fits_int32(g))
    f(int32_t{});
  else
    f(int64_t{});
}

// ---------------------------------------------------------------------------------------------------
// Entry points (registered below)

void batch_norm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                        const Tensor& running_var, bool training, double eps, bool relu, const Tensor* residual,
                        Tensor& y, Tensor& save_mean, Tensor& save_invstd) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  DeviceScope scope(x);
  dispatch_floating(x.dtype(), "batch_norm", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using P = param_t<S>;
    using A = compute_t<S>;
    if (C == 0) return;
    const cudaStream_t stream = stream_now();
    const unsigned tiles = static_cast<unsigned>((C + kLanes - 1) / kLanes);
    const dim3 block(kLanes, kRows);
    const P *pg = gamma.data<P>(), *pb = beta.data<P>();
    P *pm = save_mean.data<P>(), *pi = save_invstd.data<P>();
    // Workspaces come from the caching allocator and return to it under this stream, so whatever
    // reuses them is ordered after the kernels below.
    Tensor coef = Tensor::empty(Shape{2 * C}, accumulator_dtype<A>(), x.device());
    if (training) {
      const Partials<S> passes(M, C, x.data<S>(), nullptr);
      const int64_t parts = passes.split.parts;
      Tensor partial = Tensor::empty(Shape{parts * C}, DType::F64, x.device());
      Tensor mean64 = Tensor::empty(Shape{C}, DType::F64, x.device());
      double* ws = partial.data<double>();
      passes.template launch<StatPass::Sum>(stream, x.data<S>(), nullptr, nullptr, nullptr, nullptr, nullptr, M, C, ws);
      bn_mean_kernel<P><<<tiles, block, 0, stream>>>(ws, parts, M, C, pm, mean64.data<double>());
      CUDA_CHECK(cudaGetLastError());
      passes.template launch<StatPass::SquaredDeviation>(stream, x.data<S>(), nullptr, nullptr, nullptr,
                                                         mean64.data<double>(), nullptr, M, C, ws);
      bn_invstd_kernel<P, A><<<tiles, block, 0, stream>>>(ws, parts, M, C, eps, pg, pb, pm, pi, coef.data<A>());
      CUDA_CHECK(cudaGetLastError());
    } else {
      bn_eval_params_kernel<P, A><<<grid_for(C), kThreads, 0, stream>>>(running_mean.data<P>(), running_var.data<P>(),
                                                                        eps, pg, pb, C, pm, pi, coef.data<A>());
      CUDA_CHECK(cudaGetLastError());
    }
    if (M == 0) return;
    launch_apply<S>(stream, x.data<S>(), residual ? residual->data<S>() : nullptr, coef.data<A>(), M, C, relu,
                    y.data<S>());
  });
}

// Both backwards; beta set: y was relu(bn(x)) without a residual, and dy (y's gradient) is masked with the
// mask recomputed from x (relu_masked_dy), so neither y nor a masked copy of dy is needed.
void batch_norm_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor* beta,
                              const Tensor& save_mean, const Tensor& save_invstd, bool training, Tensor& dx,
                              Tensor& dgamma, Tensor& dbeta) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  DeviceScope scope(x);
  dispatch_floating(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using P = param_t<S>;
    using A = compute_t<S>;
    if (C == 0) return;
    const cudaStream_t stream = stream_now();
    const unsigned tiles = static_cast<unsigned>((C + kLanes - 1) / kLanes);
    const dim3 block(kLanes, kRows);
    const P *pm = save_mean.data<P>(), *pi = save_invstd.data<P>();
    Tensor relu_coef;
    if (beta) {  // the forward's scale and shift, computed as it computed them
      relu_coef = Tensor::empty(Shape{2 * C}, accumulator_dtype<A>(), x.device());
      bn_given_params_kernel<P, A>
          <<<grid_for(C), kThreads, 0, stream>>>(pm, pi, gamma.data<P>(), beta->data<P>(), C, relu_coef.data<A>());
      CUDA_CHECK(cudaGetLastError());
    }
    const A* rc = beta ? relu_coef.data<A>() : nullptr;
    const Partials<S> passes(M, C, x.data<S>(), dy.data<S>());
    const int64_t parts = passes.split.parts;
    Tensor partial = Tensor::empty(Shape{2 * parts * C}, DType::F64, x.device());
    Tensor coef = Tensor::empty(Shape{3 * C}, accumulator_dtype<A>(), x.device());
    double* ws = partial.data<double>();
    passes.template launch<StatPass::Backward>(stream, x.data<S>(), dy.data<S>(), pm, pi, nullptr, rc, M, C, ws);
    bn_backward_coef_kernel<P, A><<<tiles, block, 0, stream>>>(ws, parts, M, C, training, gamma.data<P>(), pi,
                                                               dgamma.data<P>(), dbeta.data<P>(), coef.data<A>());
    CUDA_CHECK(cudaGetLastError());
    if (M == 0) return;
    launch_dx<S>(stream, x.data<S>(), dy.data<S>(), pm, pi, coef.data<A>(), rc, M, C, dx.data<S>());
  });
}

void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                         const Tensor& save_invstd, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  batch_norm_backward_impl(x, dy, gamma, nullptr, save_mean, save_invstd, training, dx, dgamma, dbeta);
}

void batch_norm_relu_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                              const Tensor& save_mean, const Tensor& save_invstd, bool training, Tensor& dx,
                              Tensor& dgamma, Tensor& dbeta) {
  batch_norm_backward_impl(x, dy, gamma, &beta, save_mean, save_invstd, training, dx, dgamma, dbeta);
}

void batch_norm_stats(const Tensor& x, Tensor& stats) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  DeviceScope scope(x);
  dispatch_floating(x.dtype(), "batch_norm_stats", [&](auto tag) {
    using S = typename decltype(tag)::type;
    const cudaStream_t stream = stream_now();
    if (C == 0) return;
    const unsigned tiles = static_cast<unsigned>((C + kLanes - 1) / kLanes);
    const dim3 block(kLanes, kRows);
    const Partials<S> passes(M, C, x.data<S>(), nullptr);
    const int64_t parts = passes.split.parts;
    Tensor partial = Tensor::empty(Shape{parts * C}, DType::F64, x.device());
    double* ws = partial.data<double>();
    double* out = stats.data<double>();
    passes.template launch<StatPass::Sum>(stream, x.data<S>(), nullptr, nullptr, nullptr, nullptr, nullptr, M, C, ws);
    bn_stats_kernel<<<tiles, block, 0, stream>>>(ws, parts, M, C, true, out);
    CUDA_CHECK(cudaGetLastError());
    passes.template launch<StatPass::SquaredDeviation>(stream, x.data<S>(), nullptr, nullptr, nullptr, out + 1, nullptr,
                                                       M, C, ws);
    bn_stats_kernel<<<tiles, block, 0, stream>>>(ws, parts, M, C, false, out);
    CUDA_CHECK(cudaGetLastError());
  });
}

void batch_norm_apply(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                      const Tensor& invstd, bool relu, const Tensor* residual, Tensor& y) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  DeviceScope scope(x);
  dispatch_floating(x.dtype(), "batch_norm_apply", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using P = param_t<S>;
    using A = compute_t<S>;
    if (C == 0) return;
    const cudaStream_t stream = stream_now();
    Tensor coef = Tensor::empty(Shape{2 * C}, accumulator_dtype<A>(), x.device());
    bn_given_params_kernel<P, A><<<grid_for(C), kThreads, 0, stream>>>(
        mean.data<P>(), invstd.data<P>(), gamma.data<P>(), beta.data<P>(), C, coef.data<A>());
    CUDA_CHECK(cudaGetLastError());
    if (M == 0) return;
    launch_apply<S>(stream, x.data<S>(), residual ? residual->data<S>() : nullptr, coef.data<A>(), M, C, relu,
                    y.data<S>());
  });
}

void batch_norm_backward_reduce(const Tensor& x, const Tensor& dy, const Tensor& save_mean, const Tensor& save_invstd,
                                Tensor& sums) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  DeviceScope scope(x);
  dispatch_floating(x.dtype(), "batch_norm_backward_reduce", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using P = param_t<S>;
    if (C == 0) return;
    const cudaStream_t stream = stream_now();
    const unsigned tiles = static_cast<unsigned>((C + kLanes - 1) / kLanes);
    const dim3 block(kLanes, kRows);
    const Partials<S> passes(M, C, x.data<S>(), dy.data<S>());
    const int64_t parts = passes.split.parts;
    Tensor partial = Tensor::empty(Shape{2 * parts * C}, DType::F64, x.device());
    double* ws = partial.data<double>();
    passes.template launch<StatPass::Backward>(stream, x.data<S>(), dy.data<S>(), save_mean.data<P>(),
                                               save_invstd.data<P>(), nullptr, nullptr, M, C, ws);
    bn_backward_sums_kernel<<<tiles, block, 0, stream>>>(ws, parts, C, sums.data<double>());
    CUDA_CHECK(cudaGetLastError());
  });
}

void batch_norm_backward_elemt(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                               const Tensor& save_invstd, const Tensor& sums, double count, Tensor& dx) {
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  DeviceScope scope(x);
  dispatch_floating(x.dtype(), "batch_norm_backward_elemt", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using P = param_t<S>;
    using A = compute_t<S>;
    if (C == 0) return;
    const cudaStream_t stream = stream_now();
    Tensor coef = Tensor::empty(Shape{3 * C}, accumulator_dtype<A>(), x.device());
    bn_elemt_coef_kernel<P, A><<<grid_for(C), kThreads, 0, stream>>>(sums.data<double>(), count, gamma.data<P>(),
                                                                     save_invstd.data<P>(), C, coef.data<A>());
    CUDA_CHECK(cudaGetLastError());
    if (M == 0) return;
    launch_dx<S>(stream, x.data<S>(), dy.data<S>(), save_mean.data<P>(), save_invstd.data<P>(), coef.data<A>(), nullptr,
                 M, C, dx.data<S>());
  });
}

void batch_norm_update_running(const Tensor& save_mean, const Tensor& save_invstd, double eps, double momentum,
                               double var_weight, Tensor& running_mean, Tensor& running_var) {
  const int64_t C = save_mean.numel();
  DeviceScope scope(save_mean);
  dispatch_floating(save_mean.dtype(), "batch_norm_update_running", [&](auto tag) {
    using P = typename decltype(tag)::type;
    if constexpr (std::is_same_v<P, float> || std::is_same_v<P, double>) {
      if (C == 0) return;
      bn_update_running_kernel<P><<<grid_for(C), kThreads, 0, stream_now()>>>(
          save_mean.data<P>(), save_invstd.data<P>(), static_cast<P>(-eps), static_cast<P>(1.0 - momentum),
          static_cast<P>(momentum), static_cast<P>(var_weight), C, running_mean.data<P>(), running_var.data<P>());
      CUDA_CHECK(cudaGetLastError());
    } else {
      raise_unsupported("batch_norm_update_running", save_mean.dtype());  // statistics are f32 or f64
    }
  });
}

void max_pool2d_forward(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax) {
  const int64_t total = g.n * g.p * g.q * g.c;
  DeviceScope scope(x);
  dispatch_floating(x.dtype(), "max_pool2d", [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (total == 0) return;
    with_pool_index(g, [&](auto index) {
      using I = decltype(index);
      max_pool_forward_kernel<S, I><<<grid_for(total), kThreads, 0, stream_now()>>>(
          x.data<S>(), PoolGeometry<I>(g), static_cast<I>(total), y.data<S>(), argmax.data<int64_t>());
    });
    CUDA_CHECK(cudaGetLastError());
  });
}

void max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const ConvGeometry& g, Tensor& dx) {
  const int64_t total = g.n * g.h * g.w * g.c;
  DeviceScope scope(dx);
  dispatch_floating(dy.dtype(), "max_pool2d_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (total == 0) return;
    with_pool_index(g, [&](auto index) {
      using I = decltype(index);
      max_pool_backward_kernel<S, I><<<grid_for(total), kThreads, 0, stream_now()>>>(
          dy.data<S>(), argmax.data<int64_t>(), PoolGeometry<I>(g), static_cast<I>(total), dx.data<S>());
    });
    CUDA_CHECK(cudaGetLastError());
  });
}

void avg_pool2d_forward(const Tensor& x, const ConvGeometry& g, Tensor& y) {
  const int64_t total = g.n * g.p * g.q * g.c;
  DeviceScope scope(x);
  dispatch_floating(x.dtype(), "avg_pool2d", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using A = compute_t<S>;
    if (total == 0) return;
    const A inv = A(1) / static_cast<A>(g.r * g.s);  // as the CPU computes it
    with_pool_index(g, [&](auto index) {
      using I = decltype(index);
      avg_pool_forward_kernel<S, I><<<grid_for(total), kThreads, 0, stream_now()>>>(
          x.data<S>(), PoolGeometry<I>(g), inv, static_cast<I>(total), y.data<S>());
    });
    CUDA_CHECK(cudaGetLastError());
  });
}

void avg_pool2d_backward(const Tensor& dy, const ConvGeometry& g, Tensor& dx) {
  const int64_t total = g.n * g.h * g.w * g.c;
  DeviceScope scope(dx);
  dispatch_floating(dy.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using A = compute_t<S>;
    if (total == 0) return;
    const A inv = A(1) / static_cast<A>(g.r * g.s);
    with_pool_index(g, [&](auto index) {
      using I = decltype(index);
      avg_pool_backward_kernel<S, I><<<grid_for(total), kThreads, 0, stream_now()>>>(
          dy.data<S>(), PoolGeometry<I>(g), inv, static_cast<I>(total), dx.data<S>());
    });
    CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace

void register_norm_pool_kernels(KernelTable& t) {
  t.batch_norm_forward = &batch_norm_forward;
  t.batch_norm_backward = &batch_norm_backward;
  t.batch_norm_relu_backward = &batch_norm_relu_backward;
  t.batch_norm_update_running = &batch_norm_update_running;
  t.batch_norm_stats = &batch_norm_stats;
  t.batch_norm_apply = &batch_norm_apply;
  t.batch_norm_backward_reduce = &batch_norm_backward_reduce;
  t.batch_norm_backward_elemt = &batch_norm_backward_elemt;
  t.max_pool2d_forward = &max_pool2d_forward;
  t.max_pool2d_backward = &max_pool2d_backward;
  t.avg_pool2d_forward = &avg_pool2d_forward;
  t.avg_pool2d_backward = &avg_pool2d_backward;
}

}  // namespace ringtrain::cuda
