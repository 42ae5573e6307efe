// runtime/step/op_by_op_step.cpp: the step's micro-batches op by op.
#include "runtime/step/op_by_op_step.h"

#include <optional>

#include "core/autocast.h"
#include "core/clock.h"
#include "core/profile.h"

namespace ringtrain::runtime {

StepRunner::Micro OpByOpStep::micro_batches(int64_t epoch, int64_t step, int64_t& micro) {
  const StepContext& c = context_;
  // No weight changes before the optimizer: autocast casts each once for all the step's micro-batches
  // and recomputed blocks (core/autocast.h).
  WeightCastScope casts;
  Micro m;
  for (int64_t k = 0; k < c.plan.accum; ++k) {
    const auto read_start = Clock::now();
    if (k == 0) m.begin = read_start;
    c.watchdog.phase("data loading", step);
    if (micro >= c.plan.micro_per_epoch) return {};
    std::optional<data::Batch> batch;
    {
      profile::Span span("data", c.device, "data loading");
      batch = c.data.next();
    }
    if (!batch) return {};
    ++micro;
    micro_step(*batch, k, epoch, step, micro - 1, m, read_start, Clock::now());
  }
  m.ran = true;
  return m;
}

void OpByOpStep::micro_step(const data::Batch& batch, int64_t k, int64_t epoch, int64_t step, int64_t micro, Micro& m,
                            Clock::time_point read_start, Clock::time_point read_end) {
  const StepContext& c = context_;
  PhaseTimes& time = c.timer.current();
  c.watchdog.phase("forward", step);
  set_sample_draws(micro_draws(step, k));
  const Tensor loss = c.replica.forward(batch);
  add_loss(loss, {epoch, step, micro});
  const auto backward_start = Clock::now();
  c.inject.after_forward(c.world.rank(), step, k);
  c.watchdog.phase("backward", step);
  c.replica.backward(loss, k + 1 == c.plan.accum);
  const auto backward_end = Clock::now();
  time.data_wait += seconds(read_end - read_start);
  time.forward += seconds(backward_start - read_end);
  time.backward += seconds(backward_end - backward_start);
  c.trace.span("data_wait", read_start, read_end, step);
  c.trace.span("forward", read_end, backward_start, step);
  c.trace.span("backward", backward_start, backward_end, step);
  m.backward_start = backward_start;
  m.backward_end = backward_end;
}

}  // namespace ringtrain::runtime
