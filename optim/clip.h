// optim/clip.h: the global L2 norm of the gradients, and clipping by it (PyTorch's clip_grad_norm_).
//
//   sync.finish();                                             // gradients averaged
//   const double norm = clip_grad_norm(net->parameters(), 1.0);  // scaled by 1 / (norm + 1e-6) if norm > 1
//   opt.step(lr);
//
// The norm is exact to about 2^-30 and does not depend on how the elements are split or summed: the
// squares are added as fixed-point integers (x^2, exact in f64, times a power of two chosen from the
// largest |x|, then truncated), so threads, devices and ranks may add their parts in any order and get
// the same bits. That is what lets ZeRO-1, where each rank holds a shard of the gradients, clip bitwise
// like the unsharded run: its parts combine through GradientParts.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace ringtrain {

// How a result over the gradients held here combines with the other holders' (e.g. the ranks of a ZeRO-1
// shard). Both are collective: every holder calls them in the same order.
class GradientParts {
 public:
  virtual ~GradientParts() = default;
  virtual void max(std::span<uint64_t> values) const = 0;  // element-wise, in place, over every holder
  virtual void sum(std::span<uint64_t> values) const = 0;
};

// sqrt(sum of x^2) over every element of the defined gradients of `params` (and of the other parts');
// +inf or NaN when an element is not finite. Gradients may be on several devices and of any floating
// dtype; one host synchronisation per pass and device.
double grad_norm(const std::vector<Tensor>& params, const GradientParts* parts = nullptr);

// Scales every gradient by max_norm / (norm + 1e-6) when that is below 1 (each element multiplied in its
// own dtype by the same factor) and returns the norm before clipping. A non-finite norm leaves the
// gradients as they are (the caller decides: the f16 loss scaler skips such a step).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, const GradientParts* parts = nullptr);

}  // namespace ringtrain
