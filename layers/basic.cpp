// layers/basic.cpp: ReLU, Dropout, DropPath, LayerScale, Sequential.
#include "layers/basic.h"

#include "core/check.h"
#include "core/ops.h"

namespace ringtrain {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

Dropout::Dropout(double p) : p_(p) { RT_CHECK(p >= 0.0 && p < 1.0, "Dropout: probability must be in [0, 1), got ", p); }

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training()); }

DropPath::DropPath(double p) : p_(p) {
  RT_CHECK(p >= 0.0 && p <= 1.0, "DropPath: probability must be in [0, 1], got ", p);
}

Tensor DropPath::forward(const Tensor& x) { return drop_path(x, p_, is_training()); }

LayerScale::LayerScale(int64_t channels, double init, DType dtype) : channels_(channels) {
  RT_CHECK(channels > 0, "LayerScale: channels must be positive, got ", channels);
  gamma_ =
      register_parameter("gamma", Tensor::full(Shape{channels}, init, dtype == DType::F64 ? DType::F64 : DType::F32));
}

Tensor LayerScale::forward(const Tensor& x) {
  use_parameters();
  if (x.ndim() < 1 || x.size(-1) != channels_)
    RT_THROW("LayerScale(", channels_, ") '", gamma_.name(), "': input ", x.describe(), " must have ", channels_,
             " channels last");
  return mul(x, gamma_.dtype() == x.dtype() ? gamma_ : gamma_.to(x.dtype()));
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) add(m);
}

Sequential& Sequential::add(std::shared_ptr<Module> module) {
  modules_.push_back(register_module(std::to_string(modules_.size()), std::move(module)));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : modules_) y = (*m)(y);
  return y;
}

std::vector<Block> Sequential::blocks() {
  std::vector<Block> out;
  for (size_t i = 0; i < modules_.size(); ++i) {
    std::shared_ptr<Module> m = modules_[i];
    out.push_back({std::to_string(i), {m}, [m](const Tensor& x) { return (*m)(x); }, {}});
  }
  return out;
}

}  // namespace ringtrain
