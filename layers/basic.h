// layers/basic.h: the small stateless layers: ReLU, Identity, Flatten, Dropout, and Sequential.
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
