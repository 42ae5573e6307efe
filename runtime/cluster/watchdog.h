// runtime/cluster/watchdog.h: hang detection. The training thread names the phase it is in (phase("forward", step));
// a thread of the watchdog's own checks several times a second, and a phase older than the timeout is
// reported — rank, step, phase, seconds, and whether this rank is the one behind or is waiting for the
// others — and, by default, the whole job is aborted (World::abort), so no rank waits forever on a stuck
// peer. A rank waiting for others asks them, through their watchdog threads (on a communicator of the
// watchdogs' own, so a rank stuck in compute still answers), where they are, and names the ones that have
// not arrived: "rank 1 on host h has not arrived at step 5: it is in forward of step 5 for 31 s".
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/world.h"

namespace ringtrain::runtime {

class Watchdog {
 public:
  // What happens to a stuck phase; the default prints the message and aborts the job (World::abort).
  using StuckHandler = std::function<void(const std::string& message)>;
  // timeout_s <= 0: never fires (no thread is started). Collective when timeout_s > 0 on several ranks (the
  // watchdogs' communicator is made): every rank must pass the same timeout.
  Watchdog(const comm::World& world, double timeout_s, StuckHandler on_stuck = {});
  ~Watchdog();  // stops and joins its own thread; never waits for a peer
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Enters a phase (restarting the clock). `name` must outlive the watchdog (a string literal). A name
  // containing "waiting" marks a phase that waits for other ranks: if it times out, another rank is behind.
  void phase(const char* name, int64_t step);
  // The same with a detail the reports add after the name ("stage 1, micro-batch 3, from stage 0 (rank
  // 2)"), copied: it may be built on the fly.
  void phase(const char* name, int64_t step, const std::string& detail);
  // Stops the clock until the next phase() (between runs: nothing is being waited for).
  void pause();
  const char* current_phase() const { return phase_.load(); }
  int64_t current_step() const { return step_.load(); }
  double timeout_s() const { return timeout_s_; }
  // The report for a phase stuck `seconds` (what the handler receives), without the other ranks' answers.
  std::string report(double seconds) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Status;
  void run();
  void serve_requests();
  std::string ask_the_others();

  const comm::World& world_;
  double timeout_s_;
  StuckHandler on_stuck_;
  std::atomic<const char*> phase_{"startup"};
  std::atomic<int64_t> step_{0};
  std::atomic<Clock::rep> since_{Clock::now().time_since_epoch().count()};
  std::atomic<uint64_t> generation_{0};  // phase entries so far
  std::atomic<bool> paused_{false};
  mutable std::mutex detail_mutex_;
  std::string detail_;  // of the current phase, under detail_mutex_
  std::atomic<bool> has_detail_{false};
  std::string phase_text() const;  // the phase's name, and its detail in parentheses
  const bool debug_phases_;        // RT_DEBUG_PHASES: every phase entry printed (read once, not per phase)
  std::atomic<bool> stop_{false};
  MPI_Comm peers_ = MPI_COMM_NULL;  // the watchdogs' own communicator (several ranks only)
  int64_t question_ = 0;            // sequence number of the last question to the others
  struct Reply;
  std::list<Reply> replies_;  // answers being sent (a list: MPI holds their addresses)
  std::thread thread_;
};

}  // namespace ringtrain::runtime
