// layers/models/efficientnet.h: EfficientNet (Tan and Le 2019) as torchvision builds it: B0's stages of MBConv blocks
// (1x1 expansion, kxk depthwise, squeeze-and-excitation, 1x1 projection, SiLU, stochastic depth on the residual
// growing linearly to 0.2 over the blocks), B1-B7 by torchvision's width and depth multipliers. Names, widths and
// init (He fan-out, classifier uniform in +-1/sqrt(classes)) are torchvision's. NHWC throughout.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/basic.h"
#include "layers/module.h"

namespace ringtrain {

struct EfficientNetOptions {
  std::string variant = "b0";  // b0 .. b7
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  double stochastic_depth = 0.2;  // the last block's drop probability
  double dropout = -1;            // -1: the variant's (0.2 for b0)
  DType dtype = DType::F32;
};

class MBConv : public Module {
 public:
  MBConv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t expand_ratio, double drop_path, DType dtype);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MBConv"; }

 private:
  bool residual_;
  std::shared_ptr<Sequential> block_;
  std::shared_ptr<DropPath> stochastic_depth_;
};

class EfficientNet : public Module {
 public:
  explicit EfficientNet(EfficientNetOptions options = {});
  Tensor forward(const Tensor& x) override;  // x: (N, H, W, in_channels) -> logits (N, num_classes)
  std::string type_name() const override { return "EfficientNet"; }
  // features.0 (the stem), each MBConv ("features.3.1"), features.8 (the head convolution), head.
  std::vector<Block> blocks() override;

 private:
  std::shared_ptr<Sequential> features_, classifier_;
  Tensor head(const Tensor& x);
};

}  // namespace ringtrain
