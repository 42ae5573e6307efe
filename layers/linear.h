// layers/linear.h: Linear (fully connected). weight: (out, in) as in PyTorch; bias: (out).
// x: (..., in) -> (..., out). OpenBLAS on the CPU, cuBLAS on the GPU (core/ops.h linear()).
#pragma once

#include "layers/module.h"

namespace ringtrain {

enum class Bias : uint8_t { With, Without };

class Linear : public Module {
 public:
  // PyTorch's default init: weight and bias uniform in +-1/sqrt(in), drawn from the default generator.
  Linear(int64_t in_features, int64_t out_features, Bias bias = Bias::With, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_;
  Tensor weight_, bias_;
};

}  // namespace ringtrain
