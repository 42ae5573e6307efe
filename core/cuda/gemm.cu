// core/cuda/gemm.cu: the CUDA GEMM on cuBLAS (strided batched, f32 with optional TF32, f64, and f16 /
// bf16 accumulating in f32), with one cuBLAS handle per device per thread. Host code only; it is a CUDA
// source because it shares DeviceScope and the dtype checks of core/cuda/common.cuh.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

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

// cuBLAS's workspace for one handle: NVIDIA's recommended size, 32 MiB from Hopper on, 4 MiB before.
size_t workspace_bytes(int device) {
  int major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return (major >= 9 ? size_t{32} : size_t{4}) << 20;
}

// One handle per device per thread: cuBLAS handles are not meant to be shared by threads that set
// different streams. Destroyed when the thread exits. Each handle has a workspace of its own, allocated with
// the handle and given again after every cublasSetStream (which puts a handle back on cuBLAS's default
// workspace, one cuBLAS may allocate lazily: inside a CUDA graph's capture a cudaMalloc the capture refuses, or
// an allocation node in the graph). One workspace serves every stream the thread runs GEMMs on: those are
// ordered (a graph's replay waits for the caller's stream, and the caller's for the replay).
class CublasHandles {
 public:
  struct Handle {
    cublasHandle_t handle = nullptr;
    void* workspace = nullptr;
    size_t bytes = 0;
  };
  CublasHandles() = default;
  CublasHandles(const CublasHandles&) = delete;
  CublasHandles& operator=(const CublasHandles&) = delete;
  ~CublasHandles() {
    for (const Handle& h : handles_) {
      if (h.handle) CUBLAS_CHECK_NOTHROW(cublasDestroy(h.handle));
      if (h.workspace) CUDA_CHECK_NOTHROW(cudaFree(h.workspace));
    }
  }
  // The caller has made `device` current (cublasCreate binds the handle to the current device).
  const Handle& get(int device) {
    if (device >= static_cast<int>(handles_.size())) handles_.resize(static_cast<size_t>(device) + 1);
    Handle& h = handles_[static_cast<size_t>(device)];
    if (!h.handle) {
      // Made outside any capture (the first GEMM of a thread on a device is op by op) or, in relaxed mode, as
      // the caching allocator's own cudaMalloc: allocating is not capture's work.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      const size_t bytes = workspace_bytes(device);
      const cudaError_t allocated = cudaMalloc(&h.workspace, bytes);
      const cublasStatus_t created = allocated == cudaSuccess ? cublasCreate(&h.handle) : CUBLAS_STATUS_SUCCESS;
      CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      CUDA_CHECK(allocated);
      CUBLAS_CHECK(created);
      h.bytes = bytes;
    }
    return h;
  }

 private:
  std::vector<Handle> handles_;
};

// The thread's handle for `device`, on `stream` with its own workspace.
cublasHandle_t cublas_handle(int device, cudaStream_t stream) {
  thread_local CublasHandles handles;
  const CublasHandles::Handle& h = handles.get(device);
  CUBLAS_CHECK(cublasSetStream(h.handle, stream));
  CUBLAS_CHECK(cublasSetWorkspace(h.handle, h.workspace, h.bytes));
  return h.handle;
}

void gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, Tensor& c, int64_t batch, int64_t stride_a,
          int64_t stride_b, int64_t stride_c) {
  RT_CHECK(a.dtype() == b.dtype() && b.dtype() == c.dtype(), "gemm: dtypes differ: ", a.describe(), ", ", b.describe(),
           ", ", c.describe());
  if (g.m == 0 || g.n == 0 || batch == 0) return;
  if (g.k == 0) {
    // An empty inner dimension: C = beta * C (all batches), spelled out as on the CPU.
    if (g.beta == 0.0)
      fill(c, 0.0);
    else
      scalar(ScalarOp::Mul, c, g.beta, c);
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
    default:
      raise_unsupported("matmul", a.dtype());
  }
  DeviceScope scope(c);
  cublasHandle_t handle = cublas_handle(c.device().index, stream_now());
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

}  // namespace

void register_gemm_kernels(KernelTable& t) { t.gemm = &gemm; }

}  // namespace ringtrain::cuda
