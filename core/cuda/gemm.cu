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

// One handle per device per thread: cuBLAS handles are not meant to be shared by threads that set
// different streams. Destroyed when the thread exits.
class CublasHandles {
 public:
  CublasHandles() = default;
  CublasHandles(const CublasHandles&) = delete;
  CublasHandles& operator=(const CublasHandles&) = delete;
  ~CublasHandles() {
    for (cublasHandle_t handle : handles_) {
      if (handle) CUBLAS_CHECK_NOTHROW(cublasDestroy(handle));
    }
  }
  // The caller has made `device` current (cublasCreate binds the handle to the current device).
  cublasHandle_t get(int device) {
    if (device >= static_cast<int>(handles_.size())) handles_.resize(static_cast<size_t>(device) + 1, nullptr);
    cublasHandle_t& handle = handles_[static_cast<size_t>(device)];
    if (!handle) CUBLAS_CHECK(cublasCreate(&handle));
    return handle;
  }

 private:
  std::vector<cublasHandle_t> handles_;
};

cublasHandle_t cublas_handle(int device) {
  thread_local CublasHandles handles;
  return handles.get(device);
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
  cublasHandle_t handle = cublas_handle(c.device().index);
  CUBLAS_CHECK(cublasSetStream(handle, stream_now()));
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
