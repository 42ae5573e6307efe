// core/cuda/softmax.cu: the CUDA (log-)softmax and fused softmax cross-entropy kernels, forward and
// backward: one block per row with fixed-order tree reductions (deterministic), rows grid-strided.
// Semantics and rounding steps match the CPU kernels (core/cpu/softmax.cpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
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

// Launch helpers, dtype dispatch and device math: core/cuda/common.cuh.
using namespace cuda_common;

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

void softmax(const Tensor& x, int64_t rows, int64_t cols, bool log, Tensor& out) {
  if (rows == 0 || cols == 0) return;
  DeviceScope scope(out);
  const char* name = log ? "log_softmax" : "softmax";
  dispatch_floating(x.dtype(), name, [&](auto tag) {
    using S = typename decltype(tag)::type;
    softmax_kernel<S>
        <<<grid_for(rows, 1), row_threads(cols), 0, stream_now()>>>(x.data<S>(), rows, cols, log, out.data<S>());
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, int64_t rows, int64_t cols, bool log, Tensor& dx) {
  if (rows == 0 || cols == 0) return;
  RT_CHECK(y.dtype() == dy.dtype() && dy.dtype() == dx.dtype(), "softmax_backward: dtypes differ: ", y.describe(), ", ",
           dy.describe(), ", ", dx.describe());
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
// stored (rounded to S), as the CPU. A row with a label outside [0, cols) (and not the ignore index) reports
// itself through an atomicMin, which keeps the first such row whatever the block order (the dispatcher then
// throws). Class weights (in the loss type L) weigh the label's term and each class's smoothing term.
template <typename S, typename L, typename W>
__global__ void cross_entropy_kernel(const S* logits /* (rows, cols) */, const L* labels /* (rows) */, int64_t rows,
                                     int64_t cols, double smoothing, bool has_ignore, int64_t ignore_index,
                                     const W* weight /* (cols) or null */, S* log_probs /* (rows, cols) */,
                                     W* loss /* (rows) */, W* row_weight /* (rows) */, int64_t* bad_row /* (1) */) {
  using C = compute_t<S>;
  __shared__ C shared[kThreads];
  const C on = C(1) - static_cast<C>(smoothing), off = static_cast<C>(smoothing) / static_cast<C>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* in = logits + r * cols;
    S* out = log_probs + r * cols;
    const int64_t label = static_cast<int64_t>(labels[r]);
    const bool ignored = has_ignore && label == ignore_index;
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
      sum_logp += (weight ? static_cast<C>(weight[c]) : C(1)) * load_as<C>(stored);
    }
    sum_logp = block_reduce(sum_logp, shared, SumOp{});
    if (threadIdx.x == 0) {
      if (ignored) {
        loss[r] = row_weight[r] = W(0);
        continue;
      }
      C logp_label = C(0), w = C(1);
      if (label >= 0 && label < cols) {
        logp_label = load_as<C>(store_as<S>(load_as<C>(in[label]) - lse));  // the value stored above
        if (weight) w = static_cast<C>(weight[label]);
      } else {
        atomicMin(reinterpret_cast<unsigned long long*>(bad_row), static_cast<unsigned long long>(r));
      }
      loss[r] = weight ? -on * w * logp_label - off * sum_logp : -on * logp_label - off * sum_logp;
      row_weight[r] = static_cast<W>(w);
    }
  }
}

template <typename S, typename L, typename W>
__global__ void cross_entropy_backward_kernel(const S* log_probs /* (rows, cols) */, const L* labels /* (rows) */,
                                              int64_t rows, int64_t cols, double smoothing, bool has_ignore,
                                              int64_t ignore_index, const W* weight /* (cols) or null */, double scale,
                                              S* dlogits /* (rows, cols) */) {
  using C = compute_t<S>;
  const C on = C(1) - static_cast<C>(smoothing), off = static_cast<C>(smoothing) / static_cast<C>(cols);
  const C factor = static_cast<C>(scale);
  RT_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    const int64_t label = static_cast<int64_t>(labels[r]);
    if (has_ignore && label == ignore_index) {
      dlogits[i] = store_as<S>(C(0));
      continue;
    }
    const C p = dev_exp(load_as<C>(log_probs[i]));
    if (weight) {
      C weight_sum = C(0);  // the same order as the CPU's sum
      for (int64_t k = 0; k < cols; ++k) weight_sum += static_cast<C>(weight[k]);
      const C hit = label == c ? C(1) : C(0);
      dlogits[i] = store_as<S>(factor * (on * static_cast<C>(weight[label]) * (p - hit) +
                                         off * (p * weight_sum - static_cast<C>(weight[c]))));
    } else {
      const C target = off + (label == c ? on : C(0));
      dlogits[i] = store_as<S>(factor * (p - target));
    }
  }
}

template <typename F>
void dispatch_labels(DType t, F&& f) {
  switch (t) {
    case DType::I32:
      f(Tag<int32_t>{});
      return;
    case DType::I64:
      f(Tag<int64_t>{});
      return;
    default:
      RT_THROW("op 'cross_entropy': labels must be i32 or i64, got ", dtype_name(t));
  }
}

void cross_entropy(const Tensor& logits, const Tensor& labels, const CrossEntropyArgs& args, Tensor& log_probs,
                   Tensor& loss, Tensor& row_weight, Tensor& bad_row) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  if (rows == 0) return;
  DeviceScope scope(logits);
  cudaStream_t stream = stream_now();
  // Row index of the first bad label, on the device: kNoBadRow (>= rows) until a block finds one. The
  // host reads it later (core/device.h's deferred checks), so the step does not wait here.
  int64_t* bad_row_ptr = bad_row.data<int64_t>();
  fill_kernel<int64_t><<<1, 1, 0, stream>>>(bad_row_ptr, kNoBadRow, 1);
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    RT_CHECK(
        loss.dtype() == (std::is_same_v<C, double> ? DType::F64 : DType::F32) && row_weight.dtype() == loss.dtype(),
        "cross_entropy: loss ", loss.describe(), " or row weights ", row_weight.describe(),
        " have the wrong dtype for logits ", logits.describe());
    dispatch_labels(labels.dtype(), [&](auto label_tag) {
      using L = typename decltype(label_tag)::type;
      cross_entropy_kernel<S, L, C><<<grid_for(rows, 1), row_threads(cols), 0, stream>>>(
          logits.data<S>(), labels.data<L>(), rows, cols, args.smoothing, args.has_ignore, args.ignore_index,
          args.class_weight ? args.class_weight->data<C>() : nullptr, log_probs.data<S>(), loss.data<C>(),
          row_weight.data<C>(), bad_row_ptr);
    });
  });
}

void cross_entropy_backward(const Tensor& log_probs, const Tensor& labels, const CrossEntropyArgs& args, double scale,
                            Tensor& dlogits) {
  const int64_t rows = log_probs.size(0), cols = log_probs.size(1);
  if (rows == 0 || cols == 0) return;
  RT_CHECK(dlogits.dtype() == log_probs.dtype(), "cross_entropy_backward: dlogits ", dlogits.describe(),
           " must have the dtype of log_probs ", log_probs.describe());
  DeviceScope scope(dlogits);
  dispatch_floating(log_probs.dtype(), "cross_entropy_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    dispatch_labels(labels.dtype(), [&](auto label_tag) {
      using L = typename decltype(label_tag)::type;
      cross_entropy_backward_kernel<S, L, C><<<grid_for(rows * cols), kThreads, 0, stream_now()>>>(
          log_probs.data<S>(), labels.data<L>(), rows, cols, args.smoothing, args.has_ignore, args.ignore_index,
          args.class_weight ? args.class_weight->data<C>() : nullptr, scale, dlogits.data<S>());
    });
  });
}

}  // namespace

void register_softmax_kernels(KernelTable& t) {
  t.softmax = &softmax;
  t.softmax_backward = &softmax_backward;
  t.cross_entropy = &cross_entropy;
  t.cross_entropy_backward = &cross_entropy_backward;
}

}  // namespace ringtrain::cuda
