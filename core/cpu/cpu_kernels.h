// core/cpu/cpu_kernels.h (internal): CPU kernels defined outside core/cpu/kernels.cpp, gathered into the
// CPU kernel table there.
#pragma once

#include "core/kernels.h"

namespace ringtrain::cpu {

// core/cpu/conv.cpp: oneDNN for f32 (16-bit types through f32), direct loops for f64.
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvGeometry& g, Tensor& y);
void conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeometry& g, Tensor& dx);
void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw, Tensor* dbias);

// Sets oneDNN's (OpenMP) thread count; called by set_num_threads.
void set_onednn_threads(int n);

}  // namespace ringtrain::cpu

namespace ringtrain::cpu {

// core/cpu/norm_pool.cpp
void batch_norm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                        const Tensor& running_var, bool training, double eps, bool relu, const Tensor* residual, Tensor& y, Tensor& save_mean,
                        Tensor& save_invstd);
void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                         const Tensor& save_invstd, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta);
void max_pool2d_forward(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax);
void max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const ConvGeometry& g, Tensor& dx);
void avg_pool2d_forward(const Tensor& x, const ConvGeometry& g, Tensor& y);
void avg_pool2d_backward(const Tensor& dy, const ConvGeometry& g, Tensor& dx);

}  // namespace ringtrain::cpu
