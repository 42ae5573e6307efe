// layers/blocks.cpp: conv_norm_activation and SqueezeExcitation.
#include "layers/blocks.h"

#include "core/check.h"
#include "core/ops.h"
#include "core/profile.h"
#include "layers/activation.h"
#include "layers/batchnorm.h"

namespace ringtrain {

std::shared_ptr<Sequential> conv_norm_activation(int64_t in_channels, int64_t out_channels,
                                                 const ConvNormActivationOptions& o) {
  const int64_t padding = o.padding >= 0 ? o.padding : (o.kernel - 1) / 2 * o.dilation;
  auto seq = std::make_shared<Sequential>();
  seq->add(std::make_shared<Conv2d>(in_channels, out_channels,
                                    Conv2dOptions{.kernel_h = o.kernel,
                                                  .kernel_w = o.kernel,
                                                  .stride = o.stride,
                                                  .padding = padding,
                                                  .dilation = o.dilation,
                                                  .groups = o.groups,
                                                  .bias = o.batch_norm ? Bias::Without : Bias::With,
                                                  .dtype = o.dtype}));
  if (o.batch_norm) seq->add(std::make_shared<BatchNorm2d>(out_channels, o.bn_momentum, o.bn_eps, o.dtype));
  if (!o.activation.empty()) seq->add(make_activation(o.activation));
  return seq;
}

SqueezeExcitation::SqueezeExcitation(int64_t channels, int64_t squeeze_channels, const std::string& activation,
                                     const std::string& scale_activation, DType dtype)
    : channels_(channels) {
  RT_CHECK(channels > 0 && squeeze_channels > 0, "SqueezeExcitation: channels (", channels, ") and squeeze channels (",
           squeeze_channels, ") must be positive");
  const Conv2dOptions one{.kernel_h = 1, .kernel_w = 1, .bias = Bias::With, .dtype = dtype};
  fc1_ = register_module("fc1", std::make_shared<Conv2d>(channels, squeeze_channels, one));
  fc2_ = register_module("fc2", std::make_shared<Conv2d>(squeeze_channels, channels, one));
  activation_ = register_module("activation", make_activation(activation));
  scale_activation_ = register_module("scale_activation", make_activation(scale_activation));
}

Tensor SqueezeExcitation::forward(const Tensor& x) {
  profile::LayerScope layer(path());
  if (x.ndim() != 4 || x.size(3) != channels_)
    RT_THROW("SqueezeExcitation(", channels_, ") '", fc1_->weight().name(), "': input ", x.describe(),
             " must be (N, H, W, ", channels_, ")");
  // (N, 1, 1, C) -> the 1x1 convolutions on a 1x1 map, as GEMMs on (N, C) -> a scale per sample and channel.
  Tensor s = (*fc1_)(adaptive_avg_pool2d(x, 1, 1));
  s = (*scale_activation_)((*fc2_)((*activation_)(s)));
  return mul(x, s);
}

}  // namespace ringtrain
