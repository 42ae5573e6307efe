// runtime/telemetry/step_timer.cpp: PhaseTimes arithmetic and the StepTimer's sums.
#include "runtime/telemetry/step_timer.h"

#include <algorithm>

namespace ringtrain::runtime {

PhaseTimes& PhaseTimes::operator+=(const PhaseTimes& o) {
  data_wait += o.data_wait;
  forward += o.forward;
  backward += o.backward;
  exposed_comm += o.exposed_comm;
  optimizer += o.optimizer;
  return *this;
}

PhaseTimes PhaseTimes::operator/(double n) const {
  return {data_wait / n, forward / n, backward / n, exposed_comm / n, optimizer / n};
}

nlohmann::json PhaseTimes::to_json() const {
  return {{"data_wait", data_wait},
          {"forward", forward},
          {"backward", backward},
          {"exposed_comm", exposed_comm},
          {"optimizer", optimizer}};
}

void PhaseTimes::to_array(double* out) const {
  out[0] = data_wait;
  out[1] = forward;
  out[2] = backward;
  out[3] = exposed_comm;
  out[4] = optimizer;
}

PhaseTimes PhaseTimes::from_array(const double* in) { return {in[0], in[1], in[2], in[3], in[4]}; }

StepTimer::StepTimer(size_t buckets) : bucket_ready_(buckets, 0.0), bucket_allreduce_(buckets, 0.0) {}

void StepTimer::end_step(double wall_s, bool counts_in_breakdown, TimePoint backward_start,
                         const std::vector<comm::GradSync::BucketTiming>& buckets) {
  interval_ += current_;
  ++interval_steps_;
  step_times_.push_back(wall_s);
  if (counts_in_breakdown) {
    breakdown_ += current_;
    ++breakdown_steps_;
    for (const auto& b : buckets) {
      const auto i = static_cast<size_t>(b.bucket);
      if (i >= bucket_ready_.size()) continue;
      bucket_ready_[i] += std::chrono::duration<double>(b.launched - backward_start).count();
      bucket_allreduce_[i] += std::chrono::duration<double>(b.end - b.begin).count();
    }
  }
  current_ = PhaseTimes{};
}

PhaseTimes StepTimer::interval_mean() const {
  return interval_ / static_cast<double>(std::max<int64_t>(1, interval_steps_));
}

void StepTimer::reset_interval() {
  interval_ = PhaseTimes{};
  interval_steps_ = 0;
}

double StepTimer::median_step_s() const {
  if (step_times_.empty()) return 0.0;
  std::vector<double> sorted = step_times_;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  return sorted[sorted.size() / 2];
}

PhaseTimes StepTimer::breakdown_mean() const {
  return breakdown_ / static_cast<double>(std::max<int64_t>(1, breakdown_steps_));
}

double StepTimer::bucket_ready_s(size_t bucket) const {
  return bucket < bucket_ready_.size()
             ? bucket_ready_[bucket] / static_cast<double>(std::max<int64_t>(1, breakdown_steps_))
             : 0.0;
}

double StepTimer::bucket_allreduce_s(size_t bucket) const {
  return bucket < bucket_allreduce_.size()
             ? bucket_allreduce_[bucket] / static_cast<double>(std::max<int64_t>(1, breakdown_steps_))
             : 0.0;
}

}  // namespace ringtrain::runtime
