// core/cuda/table.cpp: the CUDA kernel table (core/kernels.h), assembled on first use from the op family
// files (core/cuda/<family>.cu / .cpp, declared in core/cuda/cuda_kernels.h), and the one entry that
// belongs to no family: after_op, the per-op error check. Semantics match the CPU table entry by entry;
// every kernel is deterministic (fixed-order tree reductions, no floating-point atomics) and runs on the
// calling thread's current stream. Host code only.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_kernels.h"
#include "core/device.h"
#include "core/kernels.h"

namespace ringtrain {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------------
// after_op

[[noreturn]] void raise_op_error(const char* op, cudaError_t status, bool synchronized) {
  const int device = cuda_detail::current_device_or_none();
  RT_THROW("CUDA error in op '", op, "': ", cudaGetErrorString(status), " (", cudaGetErrorName(status), ", code ",
           static_cast<int>(status), ") on ",
           device == detail::kNoDevice ? std::string("unknown device") : "cuda:" + std::to_string(device),
           synchronized ? " (found by synchronizing after the op because RINGTRAIN_CUDA_SYNC=1)"
                        : ". Kernels run asynchronously, so an earlier op may be the cause: rerun with "
                          "RINGTRAIN_CUDA_SYNC=1 to report each fault against the op that caused it");
}

void after_op(const char* op) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) raise_op_error(op, status, false);
  if (detail::cuda_sync_every_op()) {
    const auto stream = static_cast<cudaStream_t>(current_stream().handle());
    // A capture records the op instead of running it, and cannot wait: the graph's replay synchronizes.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone) return;
    detail::count_host_sync();
    status = cudaStreamSynchronize(stream);
    if (status == cudaSuccess) status = cudaGetLastError();
    if (status != cudaSuccess) raise_op_error(op, status, true);
  }
}

}  // namespace
}  // namespace cuda

const KernelTable* cuda_kernels() {
  // Built by explicit calls, not by static initializers in the family files (a static library would
  // drop the object files nothing else refers to, and their kernels with them).
  static const KernelTable table = [] {
    KernelTable t;
    cuda::register_elementwise_kernels(t);
    cuda::register_random_kernels(t);
    cuda::register_reduce_kernels(t);
    cuda::register_gemm_kernels(t);
    cuda::register_softmax_kernels(t);
    cuda::register_conv_kernels(t);
    cuda::register_norm_pool_kernels(t);
    cuda::register_optim_kernels(t);
    cuda::register_shape_kernels(t);
    cuda::register_activation_kernels(t);
    cuda::register_group_norm_kernels(t);
    cuda::register_resample_kernels(t);
    t.after_op = &cuda::after_op;
    return t;
  }();
  return &table;
}

}  // namespace ringtrain
