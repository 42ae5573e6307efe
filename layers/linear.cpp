// layers/linear.cpp: Linear; forward and backward live in core/ops.cpp linear().
#include "layers/linear.h"

#include <cmath>

#include "core/check.h"
#include "core/ops.h"
#include "core/profile.h"

namespace ringtrain {

Linear::Linear(int64_t in_features, int64_t out_features, Bias bias, DType dtype)
    : in_(in_features), out_(out_features) {
  RT_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in=", in_features,
           " out=", out_features);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight_ = register_parameter("weight", Tensor::uniform(Shape{out_features, in_features}, -bound, bound,
                                                         default_seed(), dtype, Device::cpu(), next_rng_stream()));
  if (bias == Bias::With)
    bias_ = register_parameter("bias", Tensor::uniform(Shape{out_features}, -bound, bound, default_seed(), dtype,
                                                       Device::cpu(), next_rng_stream()));
}

Tensor Linear::forward(const Tensor& x) {
  profile::LayerScope layer(path());
  use_parameters();
  if (x.ndim() < 1 || x.size(-1) != in_)
    RT_THROW("Linear(", in_, " -> ", out_, ") '", weight_.name(), "': input ", x.describe(), " must end in ", in_,
             " features");
  return linear(x, weight_, bias_);
}

}  // namespace ringtrain
