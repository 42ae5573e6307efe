// layers/models/convnext.h: ConvNeXt (Liu et al. 2022) as torchvision builds it: a 4x4 stride-4 patchify stem with
// LayerNorm, four stages of CNBlocks (7x7 depthwise convolution, LayerNorm over channels, a 4x MLP with GELU, layer
// scale, stochastic depth, residual) with LayerNorm + 2x2 stride-2 downsampling between them, then global pooling,
// LayerNorm and the classifier. On NHWC activations torchvision's permutes and its LayerNorm2d are no-ops around
// the same LayerNorm, so its names (features.1.0.block.2.weight, features.1.0.layer_scale, ...) and shapes convert
// as they are. tiny / small / base / large.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/basic.h"
#include "layers/module.h"

namespace ringtrain {

struct ConvNeXtOptions {
  std::string variant = "tiny";  // tiny, small, base, large
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  double stochastic_depth = -1;  // the last block's drop probability; -1: the variant's (0.1 for tiny)
  double layer_scale = 1e-6;
  DType dtype = DType::F32;
};

class CNBlock : public Module {
 public:
  CNBlock(int64_t dim, double layer_scale, double drop_path, DType dtype);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "CNBlock"; }

 private:
  int64_t dim_;
  std::shared_ptr<Sequential> block_;
  Tensor layer_scale_;  // (dim, 1, 1) as torchvision's
  std::shared_ptr<DropPath> stochastic_depth_;
};

class ConvNeXt : public Module {
 public:
  explicit ConvNeXt(ConvNeXtOptions options = {});
  Tensor forward(const Tensor& x) override;  // x: (N, H, W, in_channels), H and W at least 32 -> logits
  std::string type_name() const override { return "ConvNeXt"; }
  // features.0 (the stem), each CNBlock ("features.1.2"), each downsampling (features.2, .4, .6), head.
  std::vector<Block> blocks() override;

 private:
  std::shared_ptr<Sequential> features_, classifier_;
  Tensor head(const Tensor& x);
};

}  // namespace ringtrain
