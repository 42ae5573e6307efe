// core/cpu/reduce.cpp: the CPU sum / max reductions over x viewed as [outer, n, inner]. Results never
// depend on the thread count: long row sums are split into fixed-size blocks combined in a fixed order.
// The f32 block sum is compiled for AVX-512, AVX2 and baseline x86-64 (target_clones).
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

constexpr int64_t kReduceBlock = 1 << 12;  // fixed block for thread-count-independent sums

// Sum with 16 independent lanes (vectorizable, fixed order for a given n).
RT_MULTIVERSION double f32_sum_block(const float* x, int64_t n) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += x[i + l];
  double total = 0.0;
  for (int l = 0; l < 16; ++l) total += lanes[l];
  for (; i < n; ++i) total += x[i];
  return total;
}

void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out, Tensor* argmax) {
  visit_dtype(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* px = x.data<S>();
    S* po = out.data<S>();
    int64_t* pi = argmax ? argmax->data<int64_t>() : nullptr;
    if (op == ReduceOp::Sum && inner == 1) {
      // Row sums; long rows are split into fixed blocks summed in order (thread-count independent).
      const int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
      std::vector<double> partial(static_cast<size_t>(outer * std::max<int64_t>(blocks, 1)), 0.0);
      parallel_for(outer * blocks, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t row = t / blocks, blk = t % blocks;
          const int64_t begin = blk * kReduceBlock, end = std::min(n, begin + kReduceBlock);
          const S* base = px + row * n;
          double acc = 0.0;
          if constexpr (std::is_same_v<S, float>) {
            acc = f32_sum_block(base + begin, end - begin);
          } else {
            C lane = C(0);
            for (int64_t i = begin; i < end; ++i) lane += load_as<C>(base[i]);
            acc = static_cast<double>(lane);
          }
          partial[static_cast<size_t>(t)] = acc;
        }
      });
      for (int64_t row = 0; row < outer; ++row) {
        if constexpr (std::is_integral_v<C>) {
          C total = 0;
          for (int64_t i = 0; i < n; ++i) total += load_as<C>(px[row * n + i]);
          po[row] = store_as<S>(total);
        } else {
          double total = 0.0;
          for (int64_t blk = 0; blk < blocks; ++blk) total += partial[static_cast<size_t>(row * blocks + blk)];
          po[row] = store_as<S>(static_cast<C>(total));
        }
      }
      return;
    }
    // Column-style reduction: each output (o, j) walks n strided values; parallel over outputs.
    parallel_for(outer * inner, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t o = t / inner, j = t % inner;
        const S* base = px + o * n * inner + j;
        if (op == ReduceOp::Sum) {
          C acc = C(0);
          for (int64_t i = 0; i < n; ++i) acc += load_as<C>(base[i * inner]);
          po[t] = store_as<S>(acc);
        } else {
          C best = load_as<C>(base[0]);
          int64_t best_i = 0;
          for (int64_t i = 1; i < n; ++i) {
            C v = load_as<C>(base[i * inner]);
            // NaN wins and stays (propagates like PyTorch); otherwise strictly greater keeps the first max.
            if (best == best && (v > best || v != v)) {
              best = v;
              best_i = i;
            }
          }
          po[t] = store_as<S>(best);
          if (pi) pi[t] = best_i;
        }
      }
    });
  });
}

}  // namespace

void register_reduce_kernels(KernelTable& t) { t.reduce = &reduce; }

}  // namespace ringtrain::cpu
