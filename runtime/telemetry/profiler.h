// runtime/telemetry/profiler.h: --profile. After a few warm-up steps (cuDNN's algorithm search, the allocator filling
// its cache), core's recorder (core/profile.h) times every op of --profile-steps steady steps; the table
// per op family (calls per step, GPU time from CUDA events on the op's stream, host time, share of the
// step, host waits per step) is printed by rank 0 and written as the JSONL record
//   {"type":"profile","device":…,"steps":…,"step_ms":… (mean),"median_step_ms":…,"syncs_per_step":…,
//    "covered_share":…,
//    "families":[{"family":"conv_fwd","calls":…,"device_ms":…,"host_ms":…,"share":…},…]}
// and with --profile-layers "layers":[{"layer":"layer1.0.conv1","family":"conv_fwd",…},…]: each op under the
// module whose call ran it (its backward under the module that recorded it; "(none)": outside modules).
// On the CPU the same table uses host clocks. Profiling drains the device at each profiled step's start
// and end (to read its events), so those steps are not timed for the run's own figures.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/profile.h"
#include "runtime/config/options.h"  // kProfileWarmupSteps

namespace ringtrain::runtime {

class StepProfiler {
 public:
  // steps == 0: off. `first_step`: the run's first step (a resumed run starts later); the window opens
  // after `warmup` steps of this process.
  StepProfiler(Device device, int64_t steps, int64_t first_step, int64_t warmup = kProfileWarmupSteps,
               bool per_layer = false);
  bool on() const { return steps_ > 0; }
  // Around each optimizer step `step` (steps done before it).
  void begin_step(int64_t step);
  // True once, at the end of the window's last step: table() is then ready.
  bool end_step(int64_t step);
  bool in_window() const { return session_ != nullptr; }
  const std::optional<profile::Table>& table() const { return table_; }

 private:
  Device device_;
  int64_t steps_, start_;
  bool per_layer_;
  std::unique_ptr<profile::Session> session_;
  std::optional<profile::Table> table_;
};

// The table as printed, one line per family: calls, GPU ms, host ms, share; then the step and its waits.
// With per-layer rows, the `top_layers` largest (layer, family) rows follow (all are in the record).
std::string format_profile(const profile::Table& t, size_t top_layers = 25);
nlohmann::json profile_record(const profile::Table& t);

}  // namespace ringtrain::runtime
