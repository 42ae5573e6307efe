// layers/norm.h: LayerNorm and GroupNorm over NHWC activations, with torch.nn's names (weight, bias) and
// defaults. LayerNorm normalises the last dim of each position: ConvNeXt's channels-last LayerNorm (and
// torchvision's LayerNorm2d, which permutes NCHW to NHWC around the same normalisation). GroupNorm normalises each
// sample over its positions and a group of channels: the usual remedy when the per-rank batch is too small for
// batch norm. Parameters are f32 (f64 for f64 models) whatever the activation dtype; one fused kernel each way.
#pragma once

#include <string>

#include "layers/module.h"

namespace ringtrain {

class LayerNorm : public Module {
 public:
  // elementwise_affine: weight (ones) and bias (zeros) of (channels).
  explicit LayerNorm(int64_t channels, double eps = 1e-5, bool elementwise_affine = true, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LayerNorm"; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  int64_t channels_;
  double eps_;
  Tensor weight_, bias_;
};

class GroupNorm : public Module {
 public:
  // groups must divide channels; affine: weight (ones) and bias (zeros) of (channels).
  GroupNorm(int64_t groups, int64_t channels, double eps = 1e-5, bool affine = true, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) override;  // x: (N, ..., channels)
  std::string type_name() const override { return "GroupNorm"; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  int64_t groups_, channels_;
  double eps_;
  Tensor weight_, bias_;
};

}  // namespace ringtrain
