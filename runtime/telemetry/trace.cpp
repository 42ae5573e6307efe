// runtime/telemetry/trace.cpp: span recording and the merge on rank 0.
#include "runtime/telemetry/trace.h"

#include <fstream>

#include "comm/host_collectives.h"
#include "core/check.h"
#include "io/files.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

Trace::Trace(std::string path, int64_t max_steps) : path_(std::move(path)), max_steps_(max_steps) {}

void Trace::span(const std::string& name, Clock::time_point begin, Clock::time_point end, int64_t step, int tid) {
  if (!on() || step >= max_steps_) return;
  events_.push_back({{"name", name},
                     {"ph", "X"},
                     {"tid", tid},
                     {"ts", std::chrono::duration<double, std::micro>(begin - origin_).count()},
                     {"dur", std::chrono::duration<double, std::micro>(end - begin).count()},
                     {"args", {{"step", step}}}});
}

void Trace::write(const comm::World& world) const {
  if (!on()) return;
  json mine = events_;
  for (auto& e : mine) e["pid"] = world.rank();
  const std::vector<std::string> all = comm::gather_strings(world.comm(), mine.dump());
  if (!world.is_root()) return;
  json merged = json::array();
  for (int r = 0; r < world.size(); ++r) {
    merged.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"args", {{"name", detail::str_cat("rank ", r, " (", world.hosts()[r], ")")}}}});
    for (auto& e : json::parse(all[r])) merged.push_back(e);
  }
  io::write_text(path_, json{{"traceEvents", merged}, {"displayTimeUnit", "ms"}}.dump() + "\n", "--trace");
}

}  // namespace ringtrain::runtime
