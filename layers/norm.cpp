// layers/norm.cpp: LayerNorm and GroupNorm; the kernels live in core (core/cpu/group_norm.cpp).
#include "layers/norm.h"

#include <cmath>

#include "core/check.h"
#include "core/ops.h"
#include "core/profile.h"

namespace ringtrain {

LayerNorm::LayerNorm(int64_t channels, double eps, bool elementwise_affine, DType dtype)
    : channels_(channels), eps_(eps) {
  RT_CHECK(channels > 0, "LayerNorm: channels must be positive, got ", channels);
  RT_CHECK(eps > 0 && std::isfinite(eps), "LayerNorm: eps must be > 0, got ", eps);
  const DType p = dtype == DType::F64 ? DType::F64 : DType::F32;
  if (elementwise_affine) {
    weight_ = register_parameter("weight", Tensor::ones(Shape{channels}, p));
    bias_ = register_parameter("bias", Tensor::zeros(Shape{channels}, p));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  profile::LayerScope layer(path());
  use_parameters();
  if (x.ndim() < 1 || x.size(-1) != channels_)
    RT_THROW("LayerNorm(", channels_, ")", weight_.defined() ? " '" + weight_.name() + "'" : std::string(), ": input ",
             x.describe(), " must have ", channels_, " channels last");
  return layer_norm(x, weight_, bias_, eps_);
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps, bool affine, DType dtype)
    : groups_(groups), channels_(channels), eps_(eps) {
  RT_CHECK(channels > 0 && groups > 0 && channels % groups == 0, "GroupNorm: ", groups,
           " groups must divide the channels (", channels, ")");
  RT_CHECK(eps > 0 && std::isfinite(eps), "GroupNorm: eps must be > 0, got ", eps);
  const DType p = dtype == DType::F64 ? DType::F64 : DType::F32;
  if (affine) {
    weight_ = register_parameter("weight", Tensor::ones(Shape{channels}, p));
    bias_ = register_parameter("bias", Tensor::zeros(Shape{channels}, p));
  }
}

Tensor GroupNorm::forward(const Tensor& x) {
  profile::LayerScope layer(path());
  use_parameters();
  if (x.ndim() < 2 || x.size(-1) != channels_)
    RT_THROW("GroupNorm(", groups_, ", ", channels_, ")",
             weight_.defined() ? " '" + weight_.name() + "'" : std::string(), ": input ", x.describe(),
             " must be (N, ..., ", channels_, ")");
  return group_norm(x, groups_, weight_, bias_, eps_);
}

}  // namespace ringtrain
