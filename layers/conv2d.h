// layers/conv2d.h: Conv2d over NHWC activations with KRSC filters (out, kh, kw, in / groups).
// PyTorch's OIHW weights are the same tensor permuted (0, 2, 3, 1); scripts convert at import/export.
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

}  // namespace ringtrain
