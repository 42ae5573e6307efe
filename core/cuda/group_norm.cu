// core/cuda/group_norm.cu: group normalisation of x viewed as (n, s, c) -- GroupNorm on NHWC and LayerNorm over
// the last dim (s = 1, one group) -- forward and backward. One block per (n, group) task, its statistics two
// passes (the mean, then squared deviations from it) in the compute type (f32 for 16-bit x, f64 for f64) with
// fixed-order tree reductions; the parameter gradients are column sums over the n x s rows in fixed chunks of
// rows, combined in chunk order: deterministic, no atomics. Semantics: core/cpu/group_norm.cpp.
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

constexpr int64_t kRowChunk = 256;  // rows per partial column sum of the parameter gradients

// Threads for a task of `count` values: a power of 2 from 32 to kThreads.
unsigned task_threads(int64_t count) {
  unsigned threads = 32;
  while (threads < kThreads && static_cast<int64_t>(threads) < count) threads *= 2;
  return threads;
}

template <typename S, typename P>
__global__ void __launch_bounds__(kThreads)
    group_norm_forward_kernel(const S* x, const P* gamma, const P* beta, GroupNormShape g, double eps, S* y, P* mean,
                              P* rstd) {
  using C = compute_t<S>;
  __shared__ C shared[kThreads];
  const int64_t cg = g.c / g.groups, count = g.s * cg, tasks = g.n * g.groups;
  for (int64_t t = blockIdx.x; t < tasks; t += gridDim.x) {
    const int64_t n = t / g.groups, first = (t % g.groups) * cg, base = n * g.s * g.c + first;
    auto at = [&](int64_t k) { return base + (k / cg) * g.c + k % cg; };
    C sum = C(0);
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) sum += load_as<C>(x[at(k)]);
    const C m = block_reduce(sum, shared, SumOp{}) / static_cast<C>(count);
    C sq = C(0);
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const C d = load_as<C>(x[at(k)]) - m;
      sq += d * d;
    }
    const C var = block_reduce(sq, shared, SumOp{}) / static_cast<C>(count);
    const P mean_p = static_cast<P>(m), rstd_p = static_cast<P>(C(1) / dev_sqrt(var + static_cast<C>(eps)));
    if (threadIdx.x == 0) {
      mean[t] = mean_p;
      rstd[t] = rstd_p;
    }
    const C mc = static_cast<C>(mean_p), rc = static_cast<C>(rstd_p);
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const int64_t i = at(k), ch = first + k % cg;
      const C v = (load_as<C>(x[i]) - mc) * rc;
      y[i] = store_as<S>(gamma ? v * static_cast<C>(gamma[ch]) + static_cast<C>(beta[ch]) : v);
    }
  }
}

template <typename S, typename P>
__global__ void __launch_bounds__(kThreads)
    group_norm_backward_kernel(const S* x, const S* dy, const P* gamma, const P* mean, const P* rstd, GroupNormShape g,
                               S* dx) {
  using C = compute_t<S>;
  __shared__ C shared[kThreads];
  const int64_t cg = g.c / g.groups, count = g.s * cg, tasks = g.n * g.groups;
  for (int64_t t = blockIdx.x; t < tasks; t += gridDim.x) {
    const int64_t n = t / g.groups, first = (t % g.groups) * cg, base = n * g.s * g.c + first;
    auto at = [&](int64_t k) { return base + (k / cg) * g.c + k % cg; };
    const C mc = static_cast<C>(mean[t]), rc = static_cast<C>(rstd[t]);
    C sum_g = C(0), sum_gx = C(0);
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const int64_t i = at(k);
      const C gk = load_as<C>(dy[i]) * (gamma ? static_cast<C>(gamma[first + k % cg]) : C(1));
      sum_g += gk;
      sum_gx += gk * (load_as<C>(x[i]) - mc) * rc;
    }
    const C a = block_reduce(sum_g, shared, SumOp{}) / static_cast<C>(count);
    const C b = block_reduce(sum_gx, shared, SumOp{}) / static_cast<C>(count);
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const int64_t i = at(k);
      const C gk = load_as<C>(dy[i]) * (gamma ? static_cast<C>(gamma[first + k % cg]) : C(1));
      const C xhat = (load_as<C>(x[i]) - mc) * rc;
      dx[i] = store_as<S>(rc * (gk - a - xhat * b));
    }
  }
}

// partial (chunks, 2, c): per chunk of rows, the column sums of dy * xhat and of dy, each thread one channel.
template <typename S, typename P, typename A>
__global__ void __launch_bounds__(kThreads)
    group_norm_param_partial_kernel(const S* x, const S* dy, const P* mean, const P* rstd, GroupNormShape g,
                                    int64_t chunks, A* partial) {
  const int64_t cg = g.c / g.groups, rows = g.n * g.s;
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= g.c) return;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    A sg = A(0), sb = A(0);
    const int64_t end = chunk * kRowChunk + kRowChunk < rows ? chunk * kRowChunk + kRowChunk : rows;
    for (int64_t row = chunk * kRowChunk; row < end; ++row) {
      const int64_t t = (row / g.s) * g.groups + ch / cg;
      const A d = load_as<A>(dy[row * g.c + ch]);
      sg += d * (load_as<A>(x[row * g.c + ch]) - static_cast<A>(mean[t])) * static_cast<A>(rstd[t]);
      sb += d;
    }
    partial[(chunk * 2) * g.c + ch] = sg;
    partial[(chunk * 2 + 1) * g.c + ch] = sb;
  }
}

template <typename P, typename A>
__global__ void group_norm_param_sum_kernel(const A* partial, int64_t chunks, int64_t c, P* dgamma, P* dbeta) {
  RT_GRID_STRIDE(ch, c) {
    A sg = A(0), sb = A(0);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      sg += partial[(chunk * 2) * c + ch];
      sb += partial[(chunk * 2 + 1) * c + ch];
    }
    if (dgamma) dgamma[ch] = static_cast<P>(sg);
    if (dbeta) dbeta[ch] = static_cast<P>(sb);
  }
}

unsigned task_grid(int64_t tasks) { return static_cast<unsigned>(std::min<int64_t>(tasks, kMaxBlocks)); }

void group_norm_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, const GroupNormShape& g, double eps,
                        Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t cg = g.c / g.groups, count = g.s * cg;
  RT_CHECK(g.n * g.s * g.c == x.numel() && cg * g.groups == g.c && count > 0, "group_norm: ", x.describe(), " is not (",
           g.n, ", ", g.s, ", ", g.c, ") in ", g.groups, " groups");
  DeviceScope scope(y);
  dispatch_floating(x.dtype(), "group_norm", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using P = std::conditional_t<std::is_same_v<S, double>, double, float>;
    group_norm_forward_kernel<S, P><<<task_grid(g.n * g.groups), task_threads(count), 0, stream_now()>>>(
        x.data<S>(), gamma ? gamma->data<P>() : nullptr, beta ? beta->data<P>() : nullptr, g, eps, y.data<S>(),
        mean.data<P>(), rstd.data<P>());
  });
}

void group_norm_backward(const Tensor& x, const Tensor& dy, const Tensor* gamma, const Tensor& mean, const Tensor& rstd,
                         const GroupNormShape& g, Tensor& dx, Tensor* dgamma, Tensor* dbeta) {
  const int64_t cg = g.c / g.groups, count = g.s * cg;
  RT_CHECK(g.n * g.s * g.c == x.numel() && dy.numel() == x.numel() && cg * g.groups == g.c && count > 0,
           "group_norm_backward: ", x.describe(), " and ", dy.describe(), " are not (", g.n, ", ", g.s, ", ", g.c,
           ") in ", g.groups, " groups");
  DeviceScope scope(dx);
  dispatch_floating(x.dtype(), "group_norm_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using P = std::conditional_t<std::is_same_v<S, double>, double, float>;
    using A = P;  // the parameter gradients' partial sums: f32 (f64 for f64 x)
    cudaStream_t stream = stream_now();
    group_norm_backward_kernel<S, P><<<task_grid(g.n * g.groups), task_threads(count), 0, stream>>>(
        x.data<S>(), dy.data<S>(), gamma ? gamma->data<P>() : nullptr, mean.data<P>(), rstd.data<P>(), g, dx.data<S>());
    if (!dgamma && !dbeta) return;
    const int64_t rows = g.n * g.s, chunks = (rows + kRowChunk - 1) / kRowChunk;
    Tensor partial =
        Tensor::empty(Shape{chunks, 2, g.c}, std::is_same_v<A, double> ? DType::F64 : DType::F32, x.device());
    const dim3 grid(static_cast<unsigned>((g.c + kThreads - 1) / kThreads),
                    static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
    group_norm_param_partial_kernel<S, P, A><<<grid, kThreads, 0, stream>>>(
        x.data<S>(), dy.data<S>(), mean.data<P>(), rstd.data<P>(), g, chunks, partial.data<A>());
    group_norm_param_sum_kernel<P, A><<<grid_for(g.c), kThreads, 0, stream>>>(
        partial.data<A>(), chunks, g.c, dgamma ? dgamma->data<P>() : nullptr, dbeta ? dbeta->data<P>() : nullptr);
  });
}

}  // namespace

void register_group_norm_kernels(KernelTable& t) {
  t.group_norm_forward = &group_norm_forward;
  t.group_norm_backward = &group_norm_backward;
}

}  // namespace ringtrain::cuda
