// runtime/step/measure_block.cpp: one block timed on its own (measure_block.h).
#include "runtime/step/measure_block.h"

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/clock.h"

namespace ringtrain::runtime {

BlockMeasure measure_block(const Block& block, const Tensor& input, bool input_grad, std::optional<DType> half,
                           Device device, bool measure_peak, const std::function<void(const Tensor&)>& backward_from) {
  Tensor in = input.detach();
  if (input_grad) in.set_requires_grad(true);
  BlockMeasure m;
  const int64_t before = memory_stats(device).allocated_bytes;
  const auto t0 = Clock::now();
  Tensor y;
  {
    AutocastGuard autocast(half);
    y = block.forward(in);
  }
  synchronize(device);
  const auto t1 = Clock::now();
  m.kept_bytes = memory_stats(device).allocated_bytes - before;
  if (measure_peak) reset_peak_memory(device);
  if (backward_from)
    backward_from(y);
  else if (y.requires_grad())
    y.backward(Tensor::ones(y.shape(), y.dtype(), device));
  if (measure_peak) m.backward_peak = memory_stats(device).peak_allocated_bytes - before - m.kept_bytes;
  for (const auto& mod : block.modules) mod->zero_grad(true);
  synchronize(device);
  m.forward_s = seconds(t1 - t0);
  m.backward_s = seconds(Clock::now() - t1);
  m.output = y.detach();
  return m;
}

}  // namespace ringtrain::runtime
