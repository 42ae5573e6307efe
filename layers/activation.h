// layers/activation.h: the activation layers of today's CNNs as torch.nn has them (no parameters): ReLU6,
// Hardtanh, LeakyReLU, GELU, SiLU, Hardswish, Hardsigmoid, Sigmoid, Tanh. Each is one fused kernel each way
// (core/ops.h). ReLU is in layers/basic.h.
#pragma once

#include <string>

#include "core/ops.h"
#include "layers/module.h"

namespace ringtrain {

class ReLU6 : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu6(x); }
  std::string type_name() const override { return "ReLU6"; }
};

class Hardtanh : public Module {
 public:
  explicit Hardtanh(double min = -1.0, double max = 1.0);
  Tensor forward(const Tensor& x) override { return hardtanh(x, min_, max_); }
  std::string type_name() const override { return "Hardtanh"; }

 private:
  double min_, max_;
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01);
  Tensor forward(const Tensor& x) override { return leaky_relu(x, slope_); }
  std::string type_name() const override { return "LeakyReLU"; }

 private:
  double slope_;
};

class GELU : public Module {
 public:
  explicit GELU(GeluApproximation approximation = GeluApproximation::None) : approximation_(approximation) {}
  Tensor forward(const Tensor& x) override { return gelu(x, approximation_); }
  std::string type_name() const override { return "GELU"; }

 private:
  GeluApproximation approximation_;
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return silu(x); }
  std::string type_name() const override { return "SiLU"; }
};

class Hardswish : public Module {
 public:
  Tensor forward(const Tensor& x) override { return hardswish(x); }
  std::string type_name() const override { return "Hardswish"; }
};

class Hardsigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return hardsigmoid(x); }
  std::string type_name() const override { return "Hardsigmoid"; }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return sigmoid(x); }
  std::string type_name() const override { return "Sigmoid"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return tanh(x); }
  std::string type_name() const override { return "Tanh"; }
};

// An activation by its torch.nn name ("ReLU", "ReLU6", "GELU", "SiLU", "Hardswish", "Hardsigmoid", "Sigmoid",
// "Tanh", "Identity"): what the model builders take as a choice; an unknown name is an error listing them.
std::shared_ptr<Module> make_activation(const std::string& name);

}  // namespace ringtrain
