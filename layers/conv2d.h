// layers/conv2d.h: Conv2d over NHWC activations with KRSC filters (out, kh, kw, in / groups), and ConvTranspose2d
// with filters (in, kh, kw, out / groups). PyTorch's weights (OIHW, and (in, out / groups, kh, kw) for the
// transposed one) are the same tensors permuted (0, 2, 3, 1); scripts/torch_interop.py converts both ways.
#pragma once

#include "core/ops.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace ringtrain {

struct Conv2dOptions {
  int64_t kernel_h = 3, kernel_w = 3;
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
  Bias bias = Bias::Without;
  DType dtype = DType::F32;
};

class Conv2d : public Module {
 public:
  // PyTorch's default init (kaiming_uniform with a = sqrt(5): bound 1/sqrt(fan_in)), from the default generator.
  Conv2d(int64_t in_channels, int64_t out_channels, Conv2dOptions options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  // He init for ReLU networks (torchvision ResNets): normal(0, sqrt(2 / fan_out)), fan_out = K*R*S.
  void kaiming_normal_fan_out(uint64_t seed, uint64_t stream);

 private:
  int64_t in_, out_;
  Conv2dParams params_;
  Tensor weight_, bias_;
};

struct ConvTranspose2dOptions {
  int64_t kernel_h = 3, kernel_w = 3;
  int64_t stride = 1, padding = 0, output_padding = 0, dilation = 1, groups = 1;
  Bias bias = Bias::With;  // torch.nn.ConvTranspose2d's default
  DType dtype = DType::F32;
};

// The gradient of a convolution as a layer (UNet's learned upsampling): out = (in - 1) stride - 2 padding +
// dilation (kernel - 1) + output_padding + 1 on each side.
class ConvTranspose2d : public Module {
 public:
  // PyTorch's default init: kaiming_uniform with a = sqrt(5) over the weight's fan-in as torch counts it for a
  // transposed convolution (out / groups x kh x kw), bias uniform in +-1/sqrt of it; from the default generator.
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, ConvTranspose2dOptions options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ConvTranspose2d"; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  int64_t in_, out_;
  ConvTranspose2dParams params_;
  Tensor weight_, bias_;
};

}  // namespace ringtrain
