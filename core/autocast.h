// core/autocast.h: mixed precision. Inside an AutocastGuard(BF16 or F16), conv2d, linear and matmul run
// in that dtype when given f32 inputs: their inputs are converted with the differentiable to(dtype), so
// f32 master weights receive f32 gradients. Everything downstream runs in the activations' dtype
// (batch norm keeps f32 parameters and statistics; cross_entropy returns an f32 loss). The state is
// per thread and guards nest; AutocastGuard(std::nullopt) switches autocasting off for a scope.
// F16 needs loss scaling (GradScaler, optim/grad_scaler.h); BF16 does not.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

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

// Within a WeightCastScope, autocast casts each weight (a leaf tensor that requires grad) once per dtype:
// every later use in the scope (the step's other micro-batches, blocks recomputed in backward) shares that
// copy and its gradient node. The node holds nothing, so any number of backward passes run through it,
// and it runs as soon as its gradient is complete (the weight's gradient is ready then, as without the
// scope). The caller promises that no weight changes inside the scope: the trainer opens one around a
// step's forward and backward passes, before the optimizer. Per thread; an inner scope has its own casts.
class WeightCastScope {
 public:
  WeightCastScope();
  ~WeightCastScope();
  WeightCastScope(const WeightCastScope&) = delete;
  WeightCastScope& operator=(const WeightCastScope&) = delete;
  int64_t casts() const { return casts_; }    // weights cast so far
  int64_t reuses() const { return reuses_; }  // uses served by an earlier cast

 private:
  friend Tensor autocast_cast(const Tensor& x, DType dtype);
  struct Cached;
  std::vector<Cached> cached_;
  WeightCastScope* previous_;
  int64_t casts_ = 0, reuses_ = 0;
};

// x in dtype for an autocast op: the open scope's cast where x is a weight, else x.to(dtype).
Tensor autocast_cast(const Tensor& x, DType dtype);

}  // namespace ringtrain
