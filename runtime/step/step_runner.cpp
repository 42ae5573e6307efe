// runtime/step/step_runner.cpp: what every step mode shares, from the end of its micro-batches to the check-in.
#include "runtime/step/step_runner.h"

#include <cstdio>
#include <vector>

#include "comm/host_collectives.h"
#include "core/check.h"
#include "core/clock.h"
#include "runtime/cluster/check_in.h"
#include "runtime/telemetry/run_log.h"

namespace ringtrain::runtime {

StepRunner::StepRunner(StepContext context)
    : context_(std::move(context)),
      losses_(context_.device.is_cuda()),
      profiler_(context_.device, context_.options.profile_steps, context_.first_step, kProfileWarmupSteps,
                context_.options.profile_layers) {
  if (context_.device.is_cuda())
    fence_ = std::make_unique<Fence>(Fence{{Event::create(context_.device), Event::create(context_.device)}});
}

StepRunner::~StepRunner() = default;

std::string StepRunner::non_finite_loss(double loss, int64_t epoch, int64_t step, int64_t micro) {
  return detail::str_cat("non-finite loss (", loss, ") at step ", step, " (epoch ", epoch, ", micro-batch ", micro,
                         "): lower --lr, add --warmup-epochs, or check the data");
}

SampleDraws StepRunner::micro_draws(int64_t step, int64_t k) const {
  return {.set = true,
          .step = static_cast<uint64_t>(step),
          .first_sample = k * context_.plan.per_step_global + int64_t{context_.replica_index} * context_.plan.batch,
          .micro_origin = rng_stream()};
}

void StepRunner::add_loss(const Tensor& loss, const LossLog::Origin& at) { losses_.add(loss, at, context_.take_loss); }

void StepRunner::read_losses() { losses_.flush(context_.take_loss); }

void StepRunner::finish() const {
  if (profiler_.on() && !profiler_.table() && context_.world.is_root())
    std::fprintf(stderr,
                 "%s: profile: the run ended before --profile's window (%lld warm-up steps, then %lld) was over; "
                 "no table\n",
                 context_.options.program.c_str(), static_cast<long long>(kProfileWarmupSteps),
                 static_cast<long long>(context_.options.profile_steps));
}

StepRunner::End StepRunner::run(int64_t epoch, int64_t step, int64_t& micro, double since_checkpoint_s) {
  const StepContext& c = context_;
  profiler_.begin_step(step);
  const Micro m = micro_batches(epoch, step, micro);
  if (!m.ran) return {};
  PhaseTimes& time = c.timer.current();
  c.watchdog.phase("gradient all-reduce (waiting for other ranks)", step);
  if (!m.whole) {
    profile::Span span("allreduce", c.device, "gradient all-reduce");
    c.replica.finish_gradients();
  }
  const auto optimizer_start = Clock::now();
  c.watchdog.phase("optimizer", step);
  End end;
  if (!m.whole) {
    const StepOutcome outcome = c.replica.step(c.lr.at(step), step);
    end.took = outcome.took;
    if (outcome.took && c.options.clip_grad_norm > 0) end.grad_norm = outcome.grad_norm;
  }
  const auto optimizer_end = Clock::now();
  // The GPU's lag behind the host: its compute (a replayed graph's whole step), counted as backward.
  const double device_wait = pace_to_device(step);
  time.backward += device_wait;
  const auto check_in_start = Clock::now();
  const int64_t done = step + 1;
  if (c.inject.fires(c.world.rank(), done)) c.watchdog.phase("injected fault (RINGTRAIN_INJECT)", done);
  const int64_t reported = c.inject.after_step(c.world.rank(), done);
  c.watchdog.phase("step check-in (waiting for other ranks)", done);
  // --checkpoint-every-min: rank 0's clock decides, and its decision reaches every rank in the check-in.
  const bool want_checkpoint = c.world.is_root() && time_checkpoint_due(c.options, since_checkpoint_s);
  end.checkpoint_asked = check_in_step(c.world, reported, c.replica.bucket_plan(), want_checkpoint ? 1 : 0) > 0;
  const auto step_end = Clock::now();
  if (c.world.is_root()) comm::supervisor_event(nlohmann::json{{"event", "step"}, {"step", done}}.dump());
  // A replayed step's all-reduce ran inside the graph: no timings of its own (the capture step's would repeat).
  static const std::vector<comm::GradSync::BucketTiming> kNone;
  const auto& buckets = m.whole ? kNone : c.replica.sync().last_bucket_timings();
  c.trace.span("exposed_comm", m.backward_end, optimizer_start, step);
  for (const auto& b : buckets) c.trace.span(detail::str_cat("allreduce bucket ", b.bucket), b.begin, b.end, step, 1);
  c.trace.span("optimizer", optimizer_start, optimizer_end, step);
  if (device_wait > 0) c.trace.span("waiting for the GPU", optimizer_end, check_in_start, step);
  c.trace.span("step check-in", check_in_start, step_end, step);
  // The check-in waits for the slowest rank: exposed communication, not optimizer time.
  time.exposed_comm += seconds(optimizer_start - m.backward_end) + seconds(step_end - check_in_start);
  ended(seconds(step_end - m.begin));
  time.optimizer = seconds(optimizer_end - optimizer_start);
  c.timer.end_step(seconds(step_end - m.begin), counts_in_breakdown(done, c.first_step, c.plan.total_steps),
                   m.backward_start, buckets);
  if (profiler_.end_step(step)) {
    const profile::Table& table = *profiler_.table();
    if (c.world.is_root()) std::printf("%s", format_profile(table).c_str());
    c.write_record(profile_record(table));
  }
  end.ran = true;
  return end;
}

double StepRunner::pace_to_device(int64_t step) {
  if (!fence_) return 0;
  const auto start = Clock::now();
  Fence& f = *fence_;
  f.ends[f.recorded % 2].record(current_stream());
  if (f.recorded > 0) {
    const Event& previous = f.ends[(f.recorded - 1) % 2];
    if (!previous.query()) {
      context_.watchdog.phase("waiting for the GPU to finish the step before", step);
      previous.synchronize();
    }
  }
  ++f.recorded;
  return seconds(Clock::now() - start);
}

}  // namespace ringtrain::runtime
