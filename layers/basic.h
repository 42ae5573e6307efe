// layers/basic.h: the small layers: ReLU, Identity, Flatten, Dropout, DropPath (stochastic depth), LayerScale, and
// Sequential.
#pragma once

#include <initializer_list>

#include "layers/module.h"

namespace ringtrain {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ReLU"; }
};

class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "Identity"; }
};

// Flattens dims [start_dim, end] into one: (N, H, W, C) -> (N, H*W*C) with the default start_dim = 1.
class Flatten : public Module {
 public:
  explicit Flatten(int start_dim = 1) : start_dim_(start_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_dim_); }
  std::string type_name() const override { return "Flatten"; }

 private:
  int start_dim_;
};

// Zeroes elements with probability p in training (scaling the rest by 1/(1-p)); identity in eval.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }

 private:
  double p_;
};

// Stochastic depth per sample (torchvision.ops.StochasticDepth, mode "row"): in training each sample is dropped
// with probability p and the rest scaled by 1 / (1 - p); identity in eval. The draws come from the default
// generator keyed by each sample's place in the step's global batch (core/ops.h sample_draws), so a run draws the
// same masks whatever its world size and accumulation. No parameters (torchvision's "stochastic_depth" has none).
class DropPath : public Module {
 public:
  explicit DropPath(double p = 0.0);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "DropPath"; }
  double p() const { return p_; }

 private:
  double p_;
};

// A learned per-channel scale of a residual branch (CaiT / ConvNeXt's layer scale): x * gamma, gamma (channels)
// initialised to `init` (1e-6 in ConvNeXt), f32 (f64 for f64 models). torchvision's ConvNeXt keeps its own
// (C, 1, 1) parameter named layer_scale (layers/models/convnext.h); this one is timm's, named gamma.
class LayerScale : public Module {
 public:
  explicit LayerScale(int64_t channels, double init = 1e-5, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) override;  // x: (..., channels)
  std::string type_name() const override { return "LayerScale"; }
  const Tensor& gamma() const { return gamma_; }

 private:
  int64_t channels_;
  Tensor gamma_;
};

// Children named "0", "1", ... applied in order.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  Sequential& add(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return modules_.size(); }
  std::vector<Block> blocks() override;  // each child, in order
  Module& operator[](size_t i) const { return *modules_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace ringtrain
