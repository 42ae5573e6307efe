// layers/activation.cpp: the activation layers' checks and make_activation.
#include "layers/activation.h"

#include <cmath>

#include "core/check.h"
#include "layers/basic.h"

namespace ringtrain {

Hardtanh::Hardtanh(double min, double max) : min_(min), max_(max) {
  RT_CHECK(min <= max, "Hardtanh: min ", min, " must not be above max ", max);
}

LeakyReLU::LeakyReLU(double negative_slope) : slope_(negative_slope) {
  RT_CHECK(std::isfinite(negative_slope), "LeakyReLU: the negative slope must be finite, got ", negative_slope);
}

std::shared_ptr<Module> make_activation(const std::string& name) {
  if (name == "ReLU") return std::make_shared<ReLU>();
  if (name == "ReLU6") return std::make_shared<ReLU6>();
  if (name == "GELU") return std::make_shared<GELU>();
  if (name == "SiLU") return std::make_shared<SiLU>();
  if (name == "Hardswish") return std::make_shared<Hardswish>();
  if (name == "Hardsigmoid") return std::make_shared<Hardsigmoid>();
  if (name == "Sigmoid") return std::make_shared<Sigmoid>();
  if (name == "Tanh") return std::make_shared<Tanh>();
  if (name == "Identity") return std::make_shared<Identity>();
  RT_THROW("unknown activation '", name,
           "' (expected one of ReLU, ReLU6, GELU, SiLU, Hardswish, Hardsigmoid, Sigmoid, Tanh, Identity)");
}

}  // namespace ringtrain
