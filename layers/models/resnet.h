// layers/models/resnet.h: the ResNet family. ImageNet ResNets (18, 34, 50, 101, 152) follow torchvision:
// architecture (v1.5: stride on the 3x3 of a bottleneck), parameter names (conv1, bn1, layer1.0.conv1,
// layer1.0.downsample.0, fc, ...) and default init (He normal fan_out for convolutions, BN weight 1 and
// bias 0, optional zero-init of each block's last BN). CIFAR ResNets (20, 32, 44, 56, 110; He et al.
// 2016) use 3x3 stem, three stages of 16/32/64 channels, projection shortcuts when the shape changes,
// and the same naming. Activations are NHWC throughout.
#pragma once

#include <memory>
#include <string>

#include "layers/basic.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/pooling.h"

namespace ringtrain {

struct ResNetOptions {
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  bool zero_init_residual = false;
  DType dtype = DType::F32;  // parameter dtype (F64 for gradient checks)
};

class BasicBlock : public Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t in, int64_t planes, int64_t stride, DType dtype);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "BasicBlock"; }
  BatchNorm2d& last_bn() { return *bn2_; }
  void init_weights(bool zero_init_residual);

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<Sequential> downsample_;
};

class Bottleneck : public Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in, int64_t planes, int64_t stride, DType dtype);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Bottleneck"; }
  void init_weights(bool zero_init_residual);

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_, bn3_;
  std::shared_ptr<Sequential> downsample_;
};

class ResNet : public Module {
 public:
  // arch: resnet20, resnet32, resnet44, resnet56, resnet110 (CIFAR) or resnet18, resnet34, resnet50,
  // resnet101, resnet152 (ImageNet). Unknown names are an error listing the valid ones.
  ResNet(const std::string& arch, ResNetOptions options);
  Tensor forward(const Tensor& x) override;  // x: (N, H, W, in_channels) -> logits (N, num_classes)
  std::string type_name() const override { return "ResNet"; }
  const std::string& arch() const { return arch_; }
  // stem (conv1, bn1 + ReLU, max pool), each residual block ("layer2.3"), head (global average pool, fc).
  std::vector<Block> blocks() override;
  bool is_cifar() const { return cifar_; }

 private:
  std::string arch_;
  bool cifar_ = false;
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<MaxPool2d> maxpool_;
  std::vector<std::shared_ptr<Sequential>> stages_;
  std::shared_ptr<Linear> fc_;
  bool recompute_stem_ = false;  // --recompute: the stem's block recomputed too
  Tensor stem(const Tensor& x);
};

// Names accepted by ResNet, in order.
const std::vector<std::string>& resnet_archs();

}  // namespace ringtrain
