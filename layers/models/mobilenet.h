// layers/models/mobilenet.h: MobileNetV2 as torchvision builds it (Sandler et al. 2018): the 3x3 stem, 17 inverted
// residual blocks (1x1 expansion, 3x3 depthwise, 1x1 linear projection, ReLU6, a residual where the shape stays),
// the 1x1 head convolution to 1280 channels, global average pooling, dropout and the classifier. Parameter names,
// widths (_make_divisible by 8), init (He fan-out for convolutions, N(0, 0.01) for the classifier) are
// torchvision's, so its state dicts convert with scripts/torch_interop.py. NHWC throughout.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/basic.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace ringtrain {

struct MobileNetV2Options {
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  double width_mult = 1.0;
  double dropout = 0.2;
  DType dtype = DType::F32;  // parameter dtype (F64 for gradient checks)
};

class InvertedResidual : public Module {
 public:
  InvertedResidual(int64_t in, int64_t out, int64_t stride, int64_t expand_ratio, DType dtype);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "InvertedResidual"; }

 private:
  bool residual_;
  std::shared_ptr<Sequential> conv_;
};

class MobileNetV2 : public Module {
 public:
  explicit MobileNetV2(MobileNetV2Options options = {});
  Tensor forward(const Tensor& x) override;  // x: (N, H, W, in_channels) -> logits (N, num_classes)
  std::string type_name() const override { return "MobileNetV2"; }
  // features.0 (the stem), each inverted residual block (features.1 .. features.17), features.18 (the head
  // convolution), head (pooling, dropout, classifier).
  std::vector<Block> blocks() override;

 private:
  std::shared_ptr<Sequential> features_, classifier_;
  Tensor head(const Tensor& x);
};

// torchvision's _make_divisible: v rounded to a multiple of divisor, never below min_value (divisor when 0) nor
// more than 10% below v.
int64_t make_divisible(double v, int64_t divisor, int64_t min_value = 0);

// He normal (fan-out) for every convolution and zero biases, ones and zeros for every batch norm: torchvision's
// init of MobileNet and EfficientNet (their classifiers differ and are initialised by each).
void init_conv_bn_fan_out(Module& model);

}  // namespace ringtrain
