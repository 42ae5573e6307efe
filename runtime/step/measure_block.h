// runtime/step/measure_block.h: one block of a model (Module::blocks()) timed on its own: its forward, then its
// backward at once, with the memory its forward keeps for that backward. The pipeline's balancer
// (runtime/pipeline/pipeline.cpp) and the layout planner's compute probe (runtime/layout/layout_probe.cpp) both
// measure blocks this way, so their figures mean the same thing.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "core/tensor.h"
#include "layers/module.h"

namespace ringtrain::runtime {

struct BlockMeasure {
  Tensor output;              // the block's output, detached
  double forward_s = 0;       // its forward, the device synchronized
  double backward_s = 0;      // its backward and the zeroing of its gradients, synchronized
  int64_t kept_bytes = 0;     // allocated after the forward beyond before it: the output and what backward keeps
  int64_t backward_peak = 0;  // with measure_peak: the peak during the backward beyond before + kept
};

// Runs `block` on a detached copy of `input` (requiring grad when `input_grad`, as a block after another does),
// under autocast to `half` when set, then its backward: `backward_from(output)` when given (the loss's, for the
// last block), else a gradient of ones when the output requires grad (a parameter-free first block has none).
// The block's gradients are zeroed after it (measuring holds one block's, not the model's). With measure_peak,
// the device's peak counter is reset after the forward to measure the backward's.
BlockMeasure measure_block(const Block& block, const Tensor& input, bool input_grad, std::optional<DType> half,
                           Device device, bool measure_peak = false,
                           const std::function<void(const Tensor&)>& backward_from = {});

}  // namespace ringtrain::runtime
