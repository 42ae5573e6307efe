// runtime/telemetry/profiler.cpp: see runtime/telemetry/profiler.h.
#include "runtime/telemetry/profiler.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"

namespace ringtrain::runtime {

StepProfiler::StepProfiler(Device device, int64_t steps, int64_t first_step, int64_t warmup, bool per_layer)
    : device_(device), steps_(steps), start_(first_step + warmup), per_layer_(per_layer) {
  RT_CHECK(steps >= 0 && warmup >= 0, "--profile-steps must be >= 0, got ", steps);
}

void StepProfiler::begin_step(int64_t step) {
  if (!on() || table_ || step < start_) return;
  if (!session_) session_ = std::make_unique<profile::Session>(device_, per_layer_);
  session_->begin_step();
}

bool StepProfiler::end_step(int64_t step) {
  if (!session_ || step < start_) return false;
  session_->end_step();
  if (session_->steps() < steps_) return false;
  table_ = session_->table();
  session_.reset();
  return true;
}

std::string format_profile(const profile::Table& t, size_t top_layers) {
  const bool gpu = t.device.is_cuda();
  std::string out = detail::str_cat("profile (", t.device.str(), ", ", t.steps, " steady step(s), ",
                                    gpu ? "GPU time from CUDA events" : "host clocks", "):\n");
  char line[256];
  std::snprintf(line, sizeof line, "  %-14s %9s %11s %11s %7s\n", "family", "calls", gpu ? "gpu ms" : "-", "host ms",
                "share");
  out += line;
  for (const auto& f : t.families) {
    std::snprintf(line, sizeof line, "  %-14s %9.1f %11.3f %11.3f %6.1f%%\n", f.family.c_str(), f.calls,
                  gpu ? f.device_ms : 0.0, f.host_ms, 100.0 * f.share);
    out += line;
  }
  std::snprintf(line, sizeof line,
                "  step %.3f ms (mean; median %.3f); the families cover %.1f%% of it; %.1f host wait(s) per step\n",
                t.step_ms, t.median_step_ms, 100.0 * t.covered_share, t.syncs_per_step);
  out += line;
  if (!t.layers.empty()) {
    out += detail::str_cat("  the ", std::min(top_layers, t.layers.size()), " largest of ", t.layers.size(),
                           " (layer, family) rows (all in the JSONL record):\n");
    for (size_t i = 0; i < t.layers.size() && i < top_layers; ++i) {
      const auto& l = t.layers[i];
      std::snprintf(line, sizeof line, "  %-28s %-12s %7.1f %11.3f %11.3f %6.1f%%\n", l.layer.c_str(),
                    l.figures.family.c_str(), l.figures.calls, gpu ? l.figures.device_ms : 0.0, l.figures.host_ms,
                    100.0 * l.figures.share);
      out += line;
    }
  }
  return out;
}

nlohmann::json profile_record(const profile::Table& t) {
  auto row = [](const profile::FamilyRow& f) {
    return nlohmann::json{{"family", f.family},
                          {"calls", f.calls},
                          {"device_ms", f.device_ms},
                          {"host_ms", f.host_ms},
                          {"share", f.share}};
  };
  nlohmann::json families = nlohmann::json::array(), layers = nlohmann::json::array();
  for (const auto& f : t.families) families.push_back(row(f));
  for (const auto& l : t.layers) {
    layers.push_back(row(l.figures));
    layers.back()["layer"] = l.layer;
  }
  return {{"type", "profile"},
          {"device", t.device.str()},
          {"steps", t.steps},
          {"step_ms", t.step_ms},
          {"median_step_ms", t.median_step_ms},
          {"syncs_per_step", t.syncs_per_step},
          {"covered_share", t.covered_share},
          {"families", families},
          {"layers", layers}};
}

}  // namespace ringtrain::runtime
