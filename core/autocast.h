// core/autocast.h: mixed precision. Inside an AutocastGuard(BF16 or F16), conv2d, linear and matmul run
// in that dtype when given f32 inputs: their inputs are converted with the differentiable to(dtype), so
// f32 master weights receive f32 gradients. Everything downstream runs in the activations' dtype
// (batch norm keeps f32 parameters and statistics; cross_entropy returns an f32 loss). The state is
// per thread and guards nest; AutocastGuard(std::nullopt) switches autocasting off for a scope.
// F16 needs loss scaling (GradScaler, optim/grad_scaler.h); BF16 does not.
#pragma once

#include <optional>

#include "core/dtype.h"

namespace ringtrain {

class AutocastGuard {
 public:
  explicit AutocastGuard(std::optional<DType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> previous_;
};

// The calling thread's autocast dtype (nullopt: off).
std::optional<DType> autocast_dtype();

}  // namespace ringtrain
