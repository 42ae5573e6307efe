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
