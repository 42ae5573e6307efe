// core/cuda/optim.cu: the fused multi-tensor SGD step. Parameters are processed in lists of up to
// kMaxTensors per launch (their pointers travel in the kernel's argument block): blockIdx.y picks the
// tensor, blocks along x stride over its elements. ResNet-50's 161 parameters take 4 launches instead
// of several element-wise ops each. Same arithmetic, in the same order, as the CPU kernel.
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

template <typename S>
__global__ void sgd_kernel(SgdList<S> list, double lr_d, double momentum_d, double dampening_d, bool nesterov) {
  using C = compute_t<S>;
  const int t = static_cast<int>(blockIdx.y);
  S* p = list.param[t];
  const S* g = list.grad[t];
  S* m = list.momentum[t];
  const int64_t n = list.numel[t];
  const C wd = static_cast<C>(list.weight_decay[t]), mom = static_cast<C>(momentum_d),
          keep = static_cast<C>(1.0 - dampening_d), lr = static_cast<C>(lr_d);
  const bool init = list.init[t];
  RT_GRID_STRIDE(i, n) sgd_element<S, C>(p[i], g[i], m ? m + i : nullptr, wd, mom, keep, lr, init, nesterov);
}

}  // namespace

void sgd_multi_tensor(const std::vector<SgdTensor>& tensors, const SgdArgs& args) {
  if (tensors.empty()) return;
  DeviceScope scope(*tensors.front().param);
  dispatch_floating(tensors.front().param->dtype(), "sgd", [&](auto tag) {
    using S = typename decltype(tag)::type;
    for (size_t first = 0; first < tensors.size(); first += kMaxTensors) {
      const size_t count = std::min<size_t>(kMaxTensors, tensors.size() - first);
      SgdList<S> list{};
      int64_t largest = 0;
      for (size_t j = 0; j < count; ++j) {
        const SgdTensor& t = tensors[first + j];
        RT_CHECK(t.param->dtype() == tensors.front().param->dtype() && t.param->device() == tensors.front().param->device(),
                 "sgd: one fused call needs one dtype and device, got ", t.param->describe(), " and ",
                 tensors.front().param->describe());
        list.param[j] = t.param->data<S>();
        list.grad[j] = t.grad->data<S>();
        list.momentum[j] = t.momentum ? t.momentum->data<S>() : nullptr;
        list.numel[j] = t.param->numel();
        list.weight_decay[j] = t.weight_decay;
        list.init[j] = t.init_momentum;
        largest = std::max(largest, t.param->numel());
      }
      // x: blocks striding over the largest tensor (capped: smaller tensors finish early), y: the tensor.
      const dim3 grid(std::clamp(grid_for(largest), 1u, 1024u), static_cast<unsigned>(count));
      sgd_kernel<S><<<grid, kThreads, 0, stream_now()>>>(list, args.lr, args.momentum, args.dampening, args.nesterov);
      CUDA_CHECK(cudaGetLastError());
    }
  });
}

}  // namespace ringtrain::cuda
