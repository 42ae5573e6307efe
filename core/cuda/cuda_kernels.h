// core/cuda/cuda_kernels.h (internal, CUDA builds only): what the CUDA kernel files share on the host side.
// Each op family file (same base names as core/cpu/) fills its own KernelTable entries through a
// register_*_kernels function that cuda_kernels() (core/cuda/table.cpp) calls; the header also declares
// the few kernels one family calls in another. Kernel functions are named after their KernelTable entry
// and live in ringtrain::cuda (the CPU ones in ringtrain::cpu). Device-side helpers: core/cuda/common.cuh.
#pragma once

#include "core/kernels.h"

namespace ringtrain::cuda {

// Explicit registration (a registry filled by static initializers would vanish from a static library).
void register_elementwise_kernels(KernelTable& t);  // elementwise.cu: fill, convert, unary, binary, scalar
void register_random_kernels(KernelTable& t);       // random.cu: uniform, normal, dropout
void register_reduce_kernels(KernelTable& t);       // reduce.cu: sum / max over [outer, n, inner]
void register_gemm_kernels(KernelTable& t);         // gemm.cu: cuBLAS
void register_softmax_kernels(KernelTable& t);      // softmax.cu: (log-)softmax, cross-entropy, backward
void register_conv_kernels(KernelTable& t);         // conv.cpp: cuDNN, algorithms chosen once per shape
void register_norm_pool_kernels(KernelTable& t);    // norm_pool.cu: batch norm (fused add + ReLU), pooling
void register_optim_kernels(KernelTable& t);        // optim.cu: fused SGD, AdamW, loss-scale unscaling
void register_shape_kernels(KernelTable& t);        // shape.cu: strided copies (permute, cat, ...), where
void register_activation_kernels(KernelTable& t);   // activation.cu: GELU, SiLU, hardswish, clamp, ...
void register_group_norm_kernels(KernelTable& t);   // group_norm.cu: GroupNorm and LayerNorm
void register_resample_kernels(KernelTable& t);     // resample.cu: adaptive average pooling, upsampling

// core/cuda/elementwise.cu, also called by the reduction (empty dimension) and the GEMM (empty inner
// dimension). Signatures and semantics are the KernelTable's.
void fill(Tensor& out, double value);
void scalar(ScalarOp op, const Tensor& x, double s, Tensor& out);
// core/cuda/reduce.cu, also called by the convolution for its bias gradient.
void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out, Tensor* argmax);

}  // namespace ringtrain::cuda
