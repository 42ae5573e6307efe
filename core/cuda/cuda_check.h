// core/cuda/cuda_check.h: the CUDA, cuBLAS, cuDNN and NCCL members of the checking macro family
// (core/check.h). Each reports the call text, file:line and the calling thread's current device; the
// *_NOTHROW variants only print and are for destructors. Only CUDA sources include this header.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "core/check.h"

namespace ringtrain::cuda_detail {

// Status -> text; defined in core/cuda/device.cpp so that this header stays declarations only.
const char* cuda_error_text(cudaError_t status) noexcept;
const char* cublas_error_text(cublasStatus_t status) noexcept;  // our own table (names the enum value)
const char* cudnn_error_text(cudnnStatus_t status) noexcept;
const char* nccl_error_text(ncclResult_t status) noexcept;

// The calling thread's current device, or detail::kNoDevice when even cudaGetDevice fails (no driver).
// Never leaves a sticky error behind.
int current_device_or_none() noexcept;

}  // namespace ringtrain::cuda_detail

#define RT_DETAIL_CUDA_OK(s) ((s) == cudaSuccess)
#define RT_DETAIL_CUBLAS_OK(s) ((s) == CUBLAS_STATUS_SUCCESS)
#define RT_DETAIL_CUDNN_OK(s) ((s) == CUDNN_STATUS_SUCCESS)
#define RT_DETAIL_NCCL_OK(s) ((s) == ncclSuccess)
#define RT_DETAIL_CUDA_DEVICE() ::ringtrain::cuda_detail::current_device_or_none()

// Each wrapper stringizes its own argument (RT_CALL_CHECK_T) so the message shows the call as written.
#define CUDA_CHECK(call)                                                                             \
  RT_CALL_CHECK_T("CUDA", call, #call, RT_DETAIL_CUDA_OK, ::ringtrain::cuda_detail::cuda_error_text, \
                  RT_DETAIL_CUDA_DEVICE)
#define CUDA_CHECK_NOTHROW(call)                                                                             \
  RT_CALL_CHECK_NOTHROW_T("CUDA", call, #call, RT_DETAIL_CUDA_OK, ::ringtrain::cuda_detail::cuda_error_text, \
                          RT_DETAIL_CUDA_DEVICE)

#define CUBLAS_CHECK(call)                                                                                 \
  RT_CALL_CHECK_T("cuBLAS", call, #call, RT_DETAIL_CUBLAS_OK, ::ringtrain::cuda_detail::cublas_error_text, \
                  RT_DETAIL_CUDA_DEVICE)
#define CUBLAS_CHECK_NOTHROW(call)                                                                                 \
  RT_CALL_CHECK_NOTHROW_T("cuBLAS", call, #call, RT_DETAIL_CUBLAS_OK, ::ringtrain::cuda_detail::cublas_error_text, \
                          RT_DETAIL_CUDA_DEVICE)

#define CUDNN_CHECK(call)                                                                               \
  RT_CALL_CHECK_T("cuDNN", call, #call, RT_DETAIL_CUDNN_OK, ::ringtrain::cuda_detail::cudnn_error_text, \
                  RT_DETAIL_CUDA_DEVICE)
#define CUDNN_CHECK_NOTHROW(call)                                                                               \
  RT_CALL_CHECK_NOTHROW_T("cuDNN", call, #call, RT_DETAIL_CUDNN_OK, ::ringtrain::cuda_detail::cudnn_error_text, \
                          RT_DETAIL_CUDA_DEVICE)

#define NCCL_CHECK(call)                                                                             \
  RT_CALL_CHECK_T("NCCL", call, #call, RT_DETAIL_NCCL_OK, ::ringtrain::cuda_detail::nccl_error_text, \
                  RT_DETAIL_CUDA_DEVICE)
#define NCCL_CHECK_NOTHROW(call)                                                                             \
  RT_CALL_CHECK_NOTHROW_T("NCCL", call, #call, RT_DETAIL_NCCL_OK, ::ringtrain::cuda_detail::nccl_error_text, \
                          RT_DETAIL_CUDA_DEVICE)
