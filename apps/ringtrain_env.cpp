// apps/ringtrain_env: prints what ringtrain sees on this machine (build, CPU threads, CUDA devices and
// library versions, allocator) and runs a tiny forward/backward on every available device as a
// self-test. Exit code 0 when every device passed.
#include <cstdio>
#include <exception>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/device.h"
#include "core/ops.h"
#include "core/parallel.h"

using namespace ringtrain;

namespace {

std::string version_text(int v, int major_div, int minor_div, int minor_mod) {
  if (v <= 0) return "none";
  return std::to_string(v / major_div) + "." + std::to_string(v / minor_div % minor_mod);
}

// A 2-layer MLP step on random data; returns the loss before and after 20 SGD steps.
std::pair<double, double> self_test(Device device) {
  Tensor x = Tensor::normal(Shape{64, 32}, 0.0, 1.0, /*seed=*/1, DType::F32, device);
  Tensor labels = Tensor::from_vector(std::vector<double>(64, 0.0), Shape{64}, DType::I64, device);
  {
    // Labels depend on the sign of the first feature: learnable in a few steps.
    std::vector<double> host = x.to_vector(), y(64);
    for (int i = 0; i < 64; ++i) y[static_cast<size_t>(i)] = host[static_cast<size_t>(i) * 32] > 0 ? 1 : 0;
    labels = Tensor::from_vector(y, Shape{64}, DType::I64, device);
  }
  Tensor w1 = Tensor::normal(Shape{64, 32}, 0.0, 0.2, 2, DType::F32, device).set_requires_grad();
  Tensor w2 = Tensor::normal(Shape{2, 64}, 0.0, 0.2, 3, DType::F32, device).set_requires_grad();
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    Tensor loss = cross_entropy(linear(relu(linear(x, w1)), w2), labels, 0.1);
    loss.backward();
    if (step == 0) first = loss.item();
    last = loss.item();
    NoGradGuard no_grad;
    for (Tensor* w : {&w1, &w2}) {
      w->add_(w->grad(), -0.5);
      w->zero_grad();
    }
  }
  return {first, last};
}

}  // namespace

int main() {
  std::printf("ringtrain %s, CUDA %s\n", "0.1.0", RINGTRAIN_WITH_CUDA ? "built in" : "not built");
  std::printf("cpu: %d threads for this process (%d cores available, %d local ranks)\n", num_threads(),
              available_cores(), local_ranks_from_env());
  const CudaStatus& cuda = cuda_status();
  if (cuda.built_with_cuda) {
    std::printf("cuda: runtime %s, driver %s, cuDNN %d, cuBLAS %d, NCCL %d\n",
                version_text(cuda.runtime_version, 1000, 10, 100).c_str(),
                version_text(cuda.driver_version, 1000, 10, 100).c_str(), cuda.cudnn_version, cuda.cublas_version,
                cuda.nccl_version);
  }
  if (cuda.device_count == 0) std::printf("cuda: no CUDA device (%s)\n", cuda.reason.c_str());
  for (const auto& d : cuda.devices) {
    std::printf("cuda:%d: %s, %s, compute capability %d.%d, %d SMs\n", d.index, d.name.c_str(),
                format_bytes(d.total_memory_bytes).c_str(), d.compute_major, d.compute_minor, d.multiprocessors);
  }
  std::vector<Device> devices{Device::cpu()};
  for (int i = 0; i < cuda.device_count; ++i) devices.push_back(Device::cuda(i));
  int failures = 0;
  for (Device d : devices) {
    try {
      auto [first, last] = self_test(d);
      bool ok = last < first * 0.8;
      std::printf("self-test on %s: MLP loss %.4f -> %.4f after 20 SGD steps: %s\n", d.str().c_str(), first, last,
                  ok ? "ok" : "FAILED (loss did not drop)");
      failures += ok ? 0 : 1;
    } catch (const std::exception& e) {
      std::printf("self-test on %s: FAILED: %s\n", d.str().c_str(), e.what());
      ++failures;
    }
  }
  AllocatorStats cpu = cpu_allocator_stats();
  std::printf("cpu memory: peak %s held by tensors\n", format_bytes(cpu.peak_allocated_bytes).c_str());
  return failures == 0 ? 0 : 1;
}
