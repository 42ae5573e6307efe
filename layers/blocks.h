// layers/blocks.h: the building blocks torchvision's modern models share (torchvision.ops.misc):
// conv_norm_activation (Conv2dNormActivation: a Sequential of a convolution, an optional batch norm and an optional
// activation, named "0", "1", "2") and SqueezeExcitation (global average pool, fc1, activation, fc2, scale
// activation, then the input scaled per channel; fc1 and fc2 are 1x1 convolutions with biases, as torchvision's, so
// their state dicts convert as they are).
#pragma once

#include <memory>
#include <string>

#include "layers/basic.h"
#include "layers/conv2d.h"
#include "layers/module.h"

namespace ringtrain {

struct ConvNormActivationOptions {
  int64_t kernel = 3, stride = 1, groups = 1, dilation = 1;
  int64_t padding = -1;             // -1: (kernel - 1) / 2 * dilation, torchvision's
  bool batch_norm = true;           // false: no norm layer, and the convolution has a bias
  std::string activation = "ReLU";  // a torch.nn name (layers/activation.h make_activation); "" for none
  double bn_eps = 1e-5, bn_momentum = 0.1;
  DType dtype = DType::F32;
};
std::shared_ptr<Sequential> conv_norm_activation(int64_t in_channels, int64_t out_channels,
                                                 const ConvNormActivationOptions& options);

class SqueezeExcitation : public Module {
 public:
  SqueezeExcitation(int64_t channels, int64_t squeeze_channels, const std::string& activation = "ReLU",
                    const std::string& scale_activation = "Sigmoid", DType dtype = DType::F32);
  Tensor forward(const Tensor& x) override;  // x: (N, H, W, channels)
  std::string type_name() const override { return "SqueezeExcitation"; }
  Conv2d& fc1() { return *fc1_; }
  Conv2d& fc2() { return *fc2_; }

 private:
  int64_t channels_;
  std::shared_ptr<Conv2d> fc1_, fc2_;
  std::shared_ptr<Module> activation_, scale_activation_;
};

}  // namespace ringtrain
