// layers/models/unet.h: a UNet for segmentation (Ronneberger et al. 2015) in the layout of the widely used PyTorch
// port (names inc, down1.maxpool_conv.1.double_conv.0, up1.up, up1.conv..., outc.conv): an encoder of double 3x3
// convolutions (norm + ReLU) and 2x2 max pooling, a decoder of 2x2 stride-2 transposed convolutions whose outputs are
// concatenated with the encoder's features of the same size, and a 1x1 convolution to per-pixel class logits
// (N, H, W, classes). scripts/make_goldens.py holds the same network in PyTorch. Batch norm, or GroupNorm (for the
// small per-rank batches of large images) with UNetOptions::groups.
//
// Its blocks() are a chain although the network is not (the decoder reads the encoder's features): each block's
// output carries the features still to be read beside its own, rearranged to its resolution (space-to-depth) and
// concatenated over channels, so pipeline stages, recompute and the layout probe see one tensor between blocks.
// forward() itself keeps the features as they are.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/basic.h"
#include "layers/conv2d.h"
#include "layers/module.h"

namespace ringtrain {

struct UNetOptions {
  int64_t in_channels = 3;
  int64_t num_classes = 2;
  int64_t width = 16;  // the first level's channels; each level down doubles them
  int64_t depth = 3;   // poolings: H and W must be multiples of 2^depth
  int64_t groups = 0;  // > 0: GroupNorm of this many groups instead of batch norm
  DType dtype = DType::F32;
};

// (Conv3x3 -> norm -> ReLU) x 2, as a Sequential named double_conv (0..5).
class DoubleConv : public Module {
 public:
  DoubleConv(int64_t in, int64_t out, int64_t groups, DType dtype);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "DoubleConv"; }

 private:
  std::shared_ptr<Sequential> double_conv_;
  bool batch_norm_;
};

// MaxPool2d(2) then DoubleConv, as a Sequential named maxpool_conv.
class UNetDown : public Module {
 public:
  UNetDown(int64_t in, int64_t out, int64_t groups, DType dtype);
  Tensor forward(const Tensor& x) override { return maxpool_conv_->forward(x); }
  std::string type_name() const override { return "UNetDown"; }

 private:
  std::shared_ptr<Sequential> maxpool_conv_;
};

class UNetUp : public Module {
 public:
  UNetUp(int64_t in, int64_t out, int64_t groups, DType dtype);
  Tensor forward(const Tensor& x) override;  // not a single-input module: forward(x, skip)
  Tensor forward(const Tensor& x, const Tensor& skip);
  std::string type_name() const override { return "UNetUp"; }

 private:
  std::shared_ptr<ConvTranspose2d> up_;
  std::shared_ptr<DoubleConv> conv_;
};

class UNet : public Module {
 public:
  explicit UNet(UNetOptions options = {});
  Tensor forward(const Tensor& x) override;  // (N, H, W, in_channels) -> (N, H, W, num_classes) logits
  std::string type_name() const override { return "UNet"; }
  // inc, down1 .. downD, up1 .. upD, outc: a chain whose links carry the skip features (see above). A block
  // switched to recompute (--recompute) makes forward() run the chain, recomputing those blocks.
  std::vector<Block> blocks() override;
  const UNetOptions& options() const { return options_; }

 private:
  UNetOptions options_;
  std::shared_ptr<DoubleConv> inc_;
  std::vector<std::shared_ptr<UNetDown>> downs_;
  std::vector<bool> recompute_;  // per block of the chain
  std::vector<std::shared_ptr<UNetUp>> ups_;
  std::shared_ptr<Conv2d> outc_;
  std::shared_ptr<Module> outc_holder_;
  int64_t channels(int64_t level) const { return options_.width << level; }
  void check_input(const Tensor& x) const;
};

// (N, H, W, C) -> (N, H / f, W / f, f * f * C) and back: each f x f patch's pixels become channels.
Tensor space_to_depth(const Tensor& x, int64_t f);
Tensor depth_to_space(const Tensor& x, int64_t f);

}  // namespace ringtrain
