// layers/conv2d.cpp: Conv2d; the kernels live in core (core/cpu/conv.cpp).
#include "layers/conv2d.h"

#include <cmath>

#include "core/autograd.h"
#include "core/check.h"
#include "core/profile.h"

namespace ringtrain {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Conv2dOptions o) : in_(in_channels), out_(out_channels) {
  RT_CHECK(in_channels > 0 && out_channels > 0, "Conv2d: channels must be positive, got ", in_channels, " -> ",
           out_channels);
  RT_CHECK(o.groups >= 1 && in_channels % o.groups == 0 && out_channels % o.groups == 0, "Conv2d: ", in_channels,
           " -> ", out_channels, " channels are not divisible by groups=", o.groups);
  RT_CHECK(o.kernel_h >= 1 && o.kernel_w >= 1, "Conv2d: kernel must be >= 1");
  params_ = {.stride_h = o.stride,
             .stride_w = o.stride,
             .pad_h = o.padding,
             .pad_w = o.padding,
             .dilation_h = o.dilation,
             .dilation_w = o.dilation,
             .groups = o.groups};
  const int64_t fan_in = in_channels / o.groups * o.kernel_h * o.kernel_w;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight_ = register_parameter(
      "weight", Tensor::uniform(Shape{out_channels, o.kernel_h, o.kernel_w, in_channels / o.groups}, -bound, bound,
                                default_seed(), o.dtype, Device::cpu(), next_rng_stream()));
  if (o.bias == Bias::With)
    bias_ = register_parameter("bias", Tensor::uniform(Shape{out_channels}, -bound, bound, default_seed(), o.dtype,
                                                       Device::cpu(), next_rng_stream()));
}

void Conv2d::kaiming_normal_fan_out(uint64_t seed, uint64_t stream) {
  const double fan_out = static_cast<double>(weight_.size(0) * weight_.size(1) * weight_.size(2));
  Tensor init =
      Tensor::normal(weight_.shape(), 0.0, std::sqrt(2.0 / fan_out), seed, weight_.dtype(), weight_.device(), stream);
  NoGradGuard no_grad;
  Tensor(weight_).copy_(init);
}

Tensor Conv2d::forward(const Tensor& x) {
  profile::LayerScope layer(path());
  use_parameters();
  if (x.ndim() != 4 || x.size(3) != in_)
    RT_THROW("Conv2d(", in_, " -> ", out_, ") '", weight_.name(), "': input ", x.describe(), " must be (N, H, W, ", in_,
             ")");
  return conv2d(x, weight_, bias_, params_);
}

ConvTranspose2d::ConvTranspose2d(int64_t in_channels, int64_t out_channels, ConvTranspose2dOptions o)
    : in_(in_channels), out_(out_channels) {
  RT_CHECK(in_channels > 0 && out_channels > 0, "ConvTranspose2d: channels must be positive, got ", in_channels, " -> ",
           out_channels);
  RT_CHECK(o.groups >= 1 && in_channels % o.groups == 0 && out_channels % o.groups == 0,
           "ConvTranspose2d: ", in_channels, " -> ", out_channels, " channels are not divisible by groups=", o.groups);
  RT_CHECK(
      o.kernel_h >= 1 && o.kernel_w >= 1 && o.stride >= 1 && o.dilation >= 1 && o.padding >= 0 && o.output_padding >= 0,
      "ConvTranspose2d: kernel, stride and dilation must be >= 1, padding and output padding >= 0");
  RT_CHECK(o.output_padding < o.stride || o.output_padding < o.dilation, "ConvTranspose2d: output padding ",
           o.output_padding, " must be smaller than the stride (", o.stride, ") or the dilation (", o.dilation, ")");
  params_ = {.stride_h = o.stride,
             .stride_w = o.stride,
             .pad_h = o.padding,
             .pad_w = o.padding,
             .output_pad_h = o.output_padding,
             .output_pad_w = o.output_padding,
             .dilation_h = o.dilation,
             .dilation_w = o.dilation,
             .groups = o.groups};
  // torch computes the fan-in from dim 1 of its (in, out / groups, kh, kw) weight.
  const int64_t fan_in = out_channels / o.groups * o.kernel_h * o.kernel_w;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight_ = register_parameter(
      "weight", Tensor::uniform(Shape{in_channels, o.kernel_h, o.kernel_w, out_channels / o.groups}, -bound, bound,
                                default_seed(), o.dtype, Device::cpu(), next_rng_stream()));
  if (o.bias == Bias::With)
    bias_ = register_parameter("bias", Tensor::uniform(Shape{out_channels}, -bound, bound, default_seed(), o.dtype,
                                                       Device::cpu(), next_rng_stream()));
}

Tensor ConvTranspose2d::forward(const Tensor& x) {
  profile::LayerScope layer(path());
  use_parameters();
  if (x.ndim() != 4 || x.size(3) != in_)
    RT_THROW("ConvTranspose2d(", in_, " -> ", out_, ") '", weight_.name(), "': input ", x.describe(),
             " must be (N, H, W, ", in_, ")");
  return conv_transpose2d(x, weight_, bias_, params_);
}

}  // namespace ringtrain
