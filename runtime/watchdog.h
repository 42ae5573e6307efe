// runtime/watchdog.h: hang detection. The training thread names the phase it is in (phase("forward", step));
// a thread of the watchdog's own checks twice a second, and a phase older than the timeout is reported —
// rank, step, phase, seconds, and whether this rank is the one behind or is waiting for the others — and,
// by default, the whole job is aborted (World::abort), so no rank waits forever on a stuck peer.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "comm/world.h"

namespace ringtrain::runtime {

class Watchdog {
 public:
  // What happens to a stuck phase; the default prints the message and aborts the job (World::abort).
  using StuckHandler = std::function<void(const std::string& message)>;
  // timeout_s <= 0: never fires (no thread is started).
  Watchdog(const comm::World& world, double timeout_s, StuckHandler on_stuck = {});
  ~Watchdog();  // stops and joins its own thread; never communicates
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Enters a phase (restarting the clock). `name` must outlive the watchdog (a string literal). A name
  // containing "waiting" marks a phase that waits for other ranks: if it times out, another rank is behind.
  void phase(const char* name, int64_t step);
  // Stops the clock until the next phase() (between runs: nothing is being waited for).
  void pause();
  const char* current_phase() const { return phase_.load(); }
  int64_t current_step() const { return step_.load(); }
  double timeout_s() const { return timeout_s_; }
  // The report for a phase stuck `seconds` (what the handler receives).
  std::string report(double seconds) const;

 private:
  using Clock = std::chrono::steady_clock;
  void run();

  const comm::World& world_;
  double timeout_s_;
  StuckHandler on_stuck_;
  std::atomic<const char*> phase_{"startup"};
  std::atomic<int64_t> step_{0};
  std::atomic<Clock::rep> since_{Clock::now().time_since_epoch().count()};
  std::atomic<uint64_t> generation_{0};  // phase entries so far
  std::atomic<bool> paused_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ringtrain::runtime
