// runtime/telemetry/trace.h: a Chrome/Perfetto trace of the first steps of a run. Each rank records complete ("X")
// events — the training thread's phases on tid 0, the communication thread's bucket all-reduces on
// tid 1 — and write() merges them on rank 0 into one file with a process per rank ("rank R (host)").
// Only the first `max_steps` steps are kept: a trace of every step of a long run would be gigabytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/world.h"

namespace ringtrain::runtime {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  Trace() = default;  // off
  // An empty path turns the trace off.
  Trace(std::string path, int64_t max_steps);
  bool on() const { return !path_.empty(); }

  void span(const std::string& name, Clock::time_point begin, Clock::time_point end, int64_t step, int tid = 0);
  // Collective (every rank, also when off: then nothing is exchanged). Rank 0 writes the merged file;
  // an unwritable path is an error naming it.
  void write(const comm::World& world) const;

 private:
  std::string path_;
  int64_t max_steps_ = 0;
  Clock::time_point origin_ = Clock::now();
  nlohmann::json events_ = nlohmann::json::array();
};

}  // namespace ringtrain::runtime
