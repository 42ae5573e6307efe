// runtime/pipeline/pipelined_step.cpp: the step's micro-batches through the stages.
#include "runtime/pipeline/pipelined_step.h"

#include <optional>

#include "core/autocast.h"
#include "core/check.h"

namespace ringtrain::runtime {

StepRunner::Micro PipelinedStep::micro_batches(int64_t epoch, int64_t step, int64_t& micro) {
  const StepContext& c = context_;
  Micro m;
  m.begin = Clock::now();
  if (micro + c.plan.accum > c.plan.micro_per_epoch) return {};
  // No weight changes before the optimizer: autocast casts each once for all the step's micro-batches.
  WeightCastScope casts;
  const int64_t first = micro;
  auto next_batch = [&]() -> data::Batch {
    std::optional<data::Batch> b = c.data.next();
    RT_CHECK(b.has_value(), "pipeline stage ", pipeline_.grid().stage, ": the data ended at micro-batch ", micro,
             " of the epoch's ", c.plan.micro_per_epoch);
    ++micro;
    return std::move(*b);
  };
  // The last stage's losses, as its schedule computes them.
  auto on_loss = [&](int k, double loss) { c.take_loss({epoch, step, first + k}, loss); };
  const Pipeline::StepWork w = pipeline_.run_step(c.replica, step, next_batch, on_loss, c.trace);
  micro = first + c.plan.accum;  // the middle stages read nothing
  PhaseTimes& time = c.timer.current();
  time.data_wait += w.data_wait_s;
  time.forward += w.forward_s;
  time.backward += w.backward_s;
  time.exposed_comm += w.wait_s;  // waiting for the neighbours: the bubble (the check-in adds its own below)
  m.backward_start = w.backward_start;
  m.backward_end = w.backward_end;
  m.ran = true;
  return m;
}

}  // namespace ringtrain::runtime
