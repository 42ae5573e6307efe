// runtime/watchdog.cpp: the watchdog thread.
#include "runtime/watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/check.h"

namespace ringtrain::runtime {

Watchdog::Watchdog(const comm::World& world, double timeout_s, StuckHandler on_stuck)
    : world_(world), timeout_s_(timeout_s), on_stuck_(std::move(on_stuck)) {
  if (!on_stuck_) on_stuck_ = [this](const std::string& message) { world_.abort(message); };
  if (timeout_s_ > 0) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Watchdog::phase(const char* name, int64_t step) {
  if (std::getenv("RT_DEBUG_PHASES"))
    std::fprintf(stderr, "[rank %d] step %lld: %s\n", world_.rank(), static_cast<long long>(step), name);
  phase_.store(name);
  step_.store(step);
  since_.store(Clock::now().time_since_epoch().count());
  generation_.fetch_add(1);
  paused_.store(false);
}

void Watchdog::pause() { paused_.store(true); }

std::string Watchdog::report(double seconds) const {
  const char* phase = phase_.load();
  const bool waiting = std::strstr(phase, "waiting") != nullptr;
  return detail::str_cat("step ", step_.load(), " stuck in ", phase, " for ", static_cast<int64_t>(seconds),
                         " s (--timeout ", timeout_s_, ")",
                         waiting ? ": this rank is waiting for others, so some other rank is behind"
                                 : ": this rank is the one behind");
}

void Watchdog::run() {
  // Polls at 200 ms or a tenth of the timeout, whichever is shorter, so short test timeouts fire on time.
  const auto poll = std::chrono::milliseconds(
      std::max<int64_t>(1, std::min<int64_t>(200, static_cast<int64_t>(timeout_s_ * 100))));
  uint64_t reported = ~uint64_t{0};  // the phase entry last reported: a handler that returns fires once per entry
  while (!stop_) {
    std::this_thread::sleep_for(poll);
    const uint64_t generation = generation_.load();
    const auto since = Clock::time_point(Clock::duration(since_.load()));
    const double stuck = std::chrono::duration<double>(Clock::now() - since).count();
    if (stuck > timeout_s_ && !stop_ && !paused_.load() && generation != reported) {
      reported = generation;
      on_stuck_(report(stuck));
    }
  }
}

}  // namespace ringtrain::runtime
