// core/cuda/cuda_kernels.h (internal): CUDA kernels defined outside core/cuda/kernels.cu, gathered into the
// CUDA kernel table there. Signatures and semantics are the KernelTable's (core/kernels.h).
#pragma once

#include "core/kernels.h"

namespace ringtrain::cuda {

// core/cuda/conv.cpp: cuDNN (NHWC activations, KRSC filters), algorithms chosen once per shape.
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvGeometry& g, Tensor& y);
void conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeometry& g, Tensor& dx);
void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw, Tensor* dbias);

// core/cuda/norm_pool.cu: batch norm (fused residual add + ReLU) and pooling over NHWC.
void batch_norm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                        const Tensor& running_var, bool training, double eps, bool relu, const Tensor* residual, Tensor& y,
                        Tensor& save_mean, Tensor& save_invstd);
void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                         const Tensor& save_invstd, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta);
void max_pool2d_forward(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax);
void max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const ConvGeometry& g, Tensor& dx);
void avg_pool2d_forward(const Tensor& x, const ConvGeometry& g, Tensor& y);
void avg_pool2d_backward(const Tensor& dy, const ConvGeometry& g, Tensor& dx);

// core/cuda/optim.cu: the fused multi-tensor SGD and AdamW steps and loss-scale unscaling.
void sgd_multi_tensor(const std::vector<SgdTensor>& tensors, const SgdArgs& args);
void adamw_multi_tensor(const std::vector<AdamWTensor>& tensors, const AdamWArgs& args);
void unscale_multi_tensor(const std::vector<Tensor*>& grads, double inv_scale, Tensor& found_inf);

}  // namespace ringtrain::cuda
