// core/cuda/optim.cu: the fused multi-tensor SGD and AdamW steps, loss-scale unscaling and the exact
// gradient norm's passes. Tensors are processed in lists of up to kMaxTensors per launch (their pointers
// travel in the kernel's argument block, at most 4 KiB): blockIdx.y picks the tensor, blocks along x stride over its
// elements. ResNet-50's 161 parameters take 4 launches instead of several element-wise ops each. Same arithmetic, in
// the same order, as the CPU kernels (core/kernels.h holds the per-element functions both run).
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/cuda/common.cuh"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "core/kernels.h"

namespace ringtrain::cuda {
namespace {

using namespace cuda_common;

constexpr int kMaxTensors = 48;

template <typename S>
struct SgdList {
  S* param[kMaxTensors];
  const S* grad[kMaxTensors];
  S* momentum[kMaxTensors];  // null: no momentum
  int64_t numel[kMaxTensors];
  double weight_decay[kMaxTensors];
  bool init[kMaxTensors];
};

// values: null, or the step's rate on the device (SgdArgs::values), read instead of lr_d.
template <typename S>
__global__ void sgd_kernel(SgdList<S> list, double lr_d, const double* values, double momentum_d, double dampening_d,
                           bool nesterov) {
  using C = compute_t<S>;
  const int t = static_cast<int>(blockIdx.y);
  S* p = list.param[t];
  const S* g = list.grad[t];
  S* m = list.momentum[t];
  const int64_t n = list.numel[t];
  const C wd = static_cast<C>(list.weight_decay[t]), mom = static_cast<C>(momentum_d),
          keep = static_cast<C>(1.0 - dampening_d), lr = static_cast<C>(values ? values[0] : lr_d);
  const bool init = list.init[t];
  RT_GRID_STRIDE(i, n) sgd_element<S, C>(p[i], g[i], m ? m + i : nullptr, wd, mom, keep, lr, init, nesterov);
}

template <typename S>
struct AdamWList {
  S* param[kMaxTensors];
  const S* grad[kMaxTensors];
  S* exp_avg[kMaxTensors];
  S* exp_avg_sq[kMaxTensors];
  int64_t numel[kMaxTensors];
  double decay[kMaxTensors], step_size[kMaxTensors], inv_bias2[kMaxTensors];
  bool init[kMaxTensors];
  bool decays[kMaxTensors];  // with values: decay is values[2], else 1
};

template <typename S>
__global__ void adamw_kernel(AdamWList<S> list, const double* values, double beta1_d, double beta2_d, double eps_d) {
  using C = compute_t<S>;
  const int t = static_cast<int>(blockIdx.y);
  S* p = list.param[t];
  const S* g = list.grad[t];
  S* m = list.exp_avg[t];
  S* v = list.exp_avg_sq[t];
  const int64_t n = list.numel[t];
  // values (AdamWArgs::values): the step's figures on the device, read instead of the list's.
  const C decay = static_cast<C>(values ? (list.decays[t] ? values[2] : 1.0) : list.decay[t]),
          b1 = static_cast<C>(beta1_d), keep1 = static_cast<C>(1.0 - beta1_d), b2 = static_cast<C>(beta2_d),
          keep2 = static_cast<C>(1.0 - beta2_d), eps = static_cast<C>(eps_d),
          step_size = static_cast<C>(values ? values[0] : list.step_size[t]),
          inv_bias2 = static_cast<C>(values ? values[1] : list.inv_bias2[t]);
  const bool init = list.init[t];
  RT_GRID_STRIDE(i, n)
  adamw_element<S, C>(p[i], g[i], m[i], v[i], decay, b1, keep1, b2, keep2, eps, step_size, inv_bias2, init);
}

template <typename S>
struct UnscaleList {
  S* grad[kMaxTensors];
  int64_t numel[kMaxTensors];
};

template <typename S>
__global__ void unscale_kernel(UnscaleList<S> list, double inv_scale_d, float* found_inf) {
  using C = compute_t<S>;
  const int t = static_cast<int>(blockIdx.y);
  S* g = list.grad[t];
  const int64_t n = list.numel[t];
  const C inv = static_cast<C>(inv_scale_d);
  bool finite = true;
  RT_GRID_STRIDE(i, n) {
    g[i] = store_as<S>(load_as<C>(g[i]) * inv);
    finite &= isfinite(load_as<C>(g[i]));
  }
  if (!finite) *found_inf = 1.0f;
}

static_assert(sizeof(SgdList<double>) <= 4096 && sizeof(AdamWList<double>) <= 4096 &&
                  sizeof(UnscaleList<double>) <= 4096,
              "a launch's tensor list must fit the 4 KiB kernel argument block");

// Calls launch(first, count) for consecutive slices of at most kMaxTensors of `items`, after checking
// that every tensor named by tensor_of(item) has the first one's dtype and device.
template <typename Item, typename TensorOf, typename Launch>
void in_launch_chunks(const std::vector<Item>& items, const char* op, TensorOf tensor_of, Launch launch) {
  const Tensor& front = tensor_of(items.front());
  for (const Item& item : items) {
    const Tensor& t = tensor_of(item);
    RT_CHECK(t.dtype() == front.dtype() && t.device() == front.device(), op,
             ": one fused call needs one dtype and device, got ", t.describe(), " and ", front.describe());
  }
  for (size_t first = 0; first < items.size(); first += kMaxTensors)
    launch(first, std::min<size_t>(kMaxTensors, items.size() - first));
}

// x: blocks striding over the largest tensor (capped: smaller tensors finish early), y: the tensor.
dim3 list_grid(int64_t largest, size_t count) {
  return dim3(std::clamp(grid_for(largest), 1u, 1024u), static_cast<unsigned>(count));
}

void sgd_multi_tensor(const std::vector<SgdTensor>& tensors, const SgdArgs& args) {
  if (tensors.empty()) return;
  DeviceScope scope(*tensors.front().param);
  dispatch_floating(tensors.front().param->dtype(), "sgd", [&](auto tag) {
    using S = typename decltype(tag)::type;
    in_launch_chunks(
        tensors, "sgd", [](const SgdTensor& t) -> const Tensor& { return *t.param; },
        [&](size_t first, size_t count) {
          SgdList<S> list{};
          int64_t largest = 0;
          for (size_t j = 0; j < count; ++j) {
            const SgdTensor& t = tensors[first + j];
            list.param[j] = t.param->data<S>();
            list.grad[j] = t.grad->data<S>();
            list.momentum[j] = t.momentum ? t.momentum->data<S>() : nullptr;
            list.numel[j] = t.param->numel();
            list.weight_decay[j] = t.weight_decay;
            list.init[j] = t.init_momentum;
            largest = std::max(largest, t.param->numel());
          }
          sgd_kernel<S><<<list_grid(largest, count), kThreads, 0, stream_now()>>>(
              list, args.lr, args.values ? args.values->data<double>() : nullptr, args.momentum, args.dampening,
              args.nesterov);
          CUDA_CHECK(cudaGetLastError());
        });
  });
}

void adamw_multi_tensor(const std::vector<AdamWTensor>& tensors, const AdamWArgs& args) {
  if (tensors.empty()) return;
  DeviceScope scope(*tensors.front().param);
  dispatch_floating(tensors.front().param->dtype(), "adamw", [&](auto tag) {
    using S = typename decltype(tag)::type;
    in_launch_chunks(
        tensors, "adamw", [](const AdamWTensor& t) -> const Tensor& { return *t.param; },
        [&](size_t first, size_t count) {
          AdamWList<S> list{};
          int64_t largest = 0;
          for (size_t j = 0; j < count; ++j) {
            const AdamWTensor& t = tensors[first + j];
            list.param[j] = t.param->data<S>();
            list.grad[j] = t.grad->data<S>();
            list.exp_avg[j] = t.exp_avg->data<S>();
            list.exp_avg_sq[j] = t.exp_avg_sq->data<S>();
            list.numel[j] = t.param->numel();
            list.decay[j] = t.decay;
            list.step_size[j] = t.step_size;
            list.inv_bias2[j] = t.inv_bias2;
            list.init[j] = t.init;
            list.decays[j] = t.decays;
            largest = std::max(largest, t.param->numel());
          }
          adamw_kernel<S><<<list_grid(largest, count), kThreads, 0, stream_now()>>>(
              list, args.values ? args.values->data<double>() : nullptr, args.beta1, args.beta2, args.eps);
          CUDA_CHECK(cudaGetLastError());
        });
  });
}

void unscale_multi_tensor(const std::vector<Tensor*>& grads, double inv_scale, Tensor& found_inf) {
  if (grads.empty()) return;
  DeviceScope scope(*grads.front());
  RT_CHECK(found_inf.dtype() == DType::F32 && found_inf.numel() == 1 && found_inf.device() == grads.front()->device(),
           "unscale: found_inf must be one f32 on ", grads.front()->device().str(), ", got ", found_inf.describe());
  dispatch_floating(grads.front()->dtype(), "unscale", [&](auto tag) {
    using S = typename decltype(tag)::type;
    in_launch_chunks(
        grads, "unscale", [](const Tensor* t) -> const Tensor& { return *t; },
        [&](size_t first, size_t count) {
          UnscaleList<S> list{};
          int64_t largest = 0;
          for (size_t j = 0; j < count; ++j) {
            list.grad[j] = grads[first + j]->data<S>();
            list.numel[j] = grads[first + j]->numel();
            largest = std::max(largest, list.numel[j]);
          }
          unscale_kernel<S>
              <<<list_grid(largest, count), kThreads, 0, stream_now()>>>(list, inv_scale, found_inf.data<float>());
          CUDA_CHECK(cudaGetLastError());
        });
  });
}

// The exact gradient norm's passes: integer maxima and sums (atomics in any order give the same bits).
// One launch per tensor; each warp combines its threads' values before one atomic.

template <typename S>
__global__ void abs_max_kernel(const S* g, int64_t n, int* out) {
  uint32_t m = 0;
  RT_GRID_STRIDE(i, n) m = max(m, abs_bits(g[i]));
  for (int offset = 16; offset > 0; offset /= 2) m = max(m, __shfl_down_sync(0xffffffffu, m, offset));
  if ((threadIdx.x & 31) == 0 && m > 0) atomicMax(out, static_cast<int>(m));
}

template <typename S>
__global__ void square_sum_kernel(const S* g, int64_t n, double scale, unsigned long long* out) {
  unsigned long long low = 0, high = 0;
  RT_GRID_STRIDE(i, n) {
    const uint64_t v = fixed_square(g[i], scale);
    low += v & 0xffffffffu;
    high += v >> 32;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    low += __shfl_down_sync(0xffffffffu, low, offset);
    high += __shfl_down_sync(0xffffffffu, high, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    if (low) atomicAdd(out, low);
    if (high) atomicAdd(out + 1, high);
  }
}

template <typename Launch>
void per_tensor(const std::vector<Tensor*>& grads, const Tensor& out, const char* op, Launch launch) {
  if (grads.empty()) return;
  DeviceScope scope(*grads.front());
  RT_CHECK(out.device() == grads.front()->device(), op, ": the result must be on ", grads.front()->device().str(),
           ", got ", out.describe());
  dispatch_floating(grads.front()->dtype(), op, [&](auto tag) {
    using S = typename decltype(tag)::type;
    in_launch_chunks(
        grads, op, [](const Tensor* t) -> const Tensor& { return *t; },
        [&](size_t first, size_t count) {
          for (size_t j = first; j < first + count; ++j)
            if (grads[j]->numel() > 0) launch(grads[j]->template data<S>(), grads[j]->numel());
        });
  });
}

void abs_max_multi_tensor(const std::vector<Tensor*>& grads, Tensor& out) {
  per_tensor(grads, out, "grad_norm", [&](const auto* g, int64_t n) {
    abs_max_kernel<<<std::clamp(grid_for(n), 1u, 1024u), kThreads, 0, stream_now()>>>(g, n, out.data<int32_t>());
    CUDA_CHECK(cudaGetLastError());
  });
}

void square_sum_multi_tensor(const std::vector<Tensor*>& grads, double scale, Tensor& out) {
  auto* o = reinterpret_cast<unsigned long long*>(out.data<int64_t>());
  per_tensor(grads, out, "grad_norm", [&](const auto* g, int64_t n) {
    square_sum_kernel<<<std::clamp(grid_for(n), 1u, 1024u), kThreads, 0, stream_now()>>>(g, n, scale, o);
    CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace

void register_optim_kernels(KernelTable& t) {
  t.sgd_multi_tensor = &sgd_multi_tensor;
  t.adamw_multi_tensor = &adamw_multi_tensor;
  t.unscale_multi_tensor = &unscale_multi_tensor;
  t.abs_max_multi_tensor = &abs_max_multi_tensor;
  t.square_sum_multi_tensor = &square_sum_multi_tensor;
}

}  // namespace ringtrain::cuda
