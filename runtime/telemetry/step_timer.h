// runtime/telemetry/step_timer.h: where a training step's time goes. PhaseTimes names the five parts every report
// uses (data_wait, forward, backward, exposed_comm, optimizer); StepTimer keeps the current step's parts,
// their sum over the logging interval, the run's breakdown (every step but the first: allocations and
// caches), each step's wall time (for the median) and, per gradient bucket, when it became ready in the
// last backward and how long its all-reduce took.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "comm/grad_sync.h"

namespace ringtrain::runtime {

struct PhaseTimes {
  double data_wait = 0, forward = 0, backward = 0;
  double exposed_comm = 0;  // waiting for gradients after backward and for the step check-in (slower ranks)
  double optimizer = 0;

  PhaseTimes& operator+=(const PhaseTimes& o);
  PhaseTimes operator/(double n) const;
  // {"data_wait": ..., "forward": ..., ...}: the "time" of train records and the summary's breakdowns.
  nlohmann::json to_json() const;
  static constexpr int kCount = 5;
  // The five values in the order above (for collectives), and back.
  void to_array(double* out) const;
  static PhaseTimes from_array(const double* in);
};

class StepTimer {
 public:
  using TimePoint = comm::Work::TimePoint;
  explicit StepTimer(size_t buckets = 0);

  // The step being timed: phases add into it (micro-batches accumulate).
  PhaseTimes& current() { return current_; }
  // Ends the step: its wall time, and, for the breakdown, the buckets of its last backward (launch times
  // relative to `backward_start`). Steps with counts_in_breakdown false (the run's first) only count in
  // the interval and the median.
  void end_step(double wall_s, bool counts_in_breakdown, TimePoint backward_start,
                const std::vector<comm::GradSync::BucketTiming>& buckets);

  // The logging interval: its mean per step, its step count; reset after each report.
  PhaseTimes interval_mean() const;
  int64_t interval_steps() const { return interval_steps_; }
  void reset_interval();

  double median_step_s() const;  // 0 before any step
  PhaseTimes breakdown_mean() const;
  int64_t breakdown_steps() const { return breakdown_steps_; }
  // Means over the breakdown's steps, per bucket.
  double bucket_ready_s(size_t bucket) const;
  double bucket_allreduce_s(size_t bucket) const;

 private:
  PhaseTimes current_, interval_, breakdown_;
  int64_t interval_steps_ = 0, breakdown_steps_ = 0;
  std::vector<double> step_times_, bucket_ready_, bucket_allreduce_;
};

}  // namespace ringtrain::runtime
