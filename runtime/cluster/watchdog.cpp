// runtime/cluster/watchdog.cpp: the watchdog thread.
#include "runtime/cluster/watchdog.h"
#include "core/env.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "comm/mpi_check.h"
#include "core/check.h"

namespace ringtrain::runtime {

namespace {
constexpr int kAskTag = 7301, kAnswerTag = 7302;
}  // namespace

// One rank's answer: where its training thread is.
struct Watchdog::Status {
  int64_t question = 0;  // echoes the asker's sequence number (stale answers are dropped)
  int64_t step = 0;
  double seconds = 0;  // in this phase so far
  int32_t paused = 0;
  char phase[240] = {};
};

struct Watchdog::Reply {
  MPI_Request request = MPI_REQUEST_NULL;
  Status status;
};

Watchdog::Watchdog(const comm::World& world, double timeout_s, StuckHandler on_stuck)
    : world_(world),
      timeout_s_(timeout_s),
      on_stuck_(std::move(on_stuck)),
      debug_phases_(ringtrain_switch("RINGTRAIN_DEBUG_PHASES")) {
  if (!on_stuck_) on_stuck_ = [this](const std::string& message) { world_.abort(message); };
  if (timeout_s_ <= 0) return;
  if (world_.size() > 1 && world_.thread_level() == MPI_THREAD_MULTIPLE) {
    MPI_CHECK(MPI_Comm_dup(world_.comm(), &peers_));
    MPI_CHECK(MPI_Comm_set_errhandler(peers_, MPI_ERRORS_RETURN));
  }
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  // Local: answers still on their way are let go (MPI may still read them, so their memory is kept); the
  // communicator is marked for freeing, which does not wait for the others.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (!replies_.empty()) {
    for (Reply& r : replies_) MPI_Request_free(&r.request);
    new std::list<Reply>(std::move(replies_));  // a few bytes, only when a peer never took its answer
  }
  if (peers_ != MPI_COMM_NULL) MPI_Comm_free(&peers_);
}

void Watchdog::phase(const char* name, int64_t step, const std::string& detail) {
  {
    std::lock_guard<std::mutex> lock(detail_mutex_);
    detail_ = detail;
    has_detail_.store(true);
  }
  phase(name, step);
  has_detail_.store(true);  // phase() cleared it
}

std::string Watchdog::phase_text() const {
  const char* name = phase_.load();
  if (!has_detail_.load()) return name;
  std::lock_guard<std::mutex> lock(detail_mutex_);
  return detail_.empty() ? std::string(name) : detail::str_cat(name, " (", detail_, ")");
}

void Watchdog::phase(const char* name, int64_t step) {
  if (debug_phases_)
    std::fprintf(stderr, "[rank %d] step %lld: %s\n", world_.rank(), static_cast<long long>(step), name);
  has_detail_.store(false);
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
  return detail::str_cat(
      "step ", step_.load(), " stuck in ", phase_text(), " for ", static_cast<int64_t>(seconds), " s (--timeout ",
      timeout_s_, ")",
      waiting ? ": this rank is waiting for others, so some other rank is behind" : ": this rank is the one behind");
}

void Watchdog::run() {
  // Polls at 100 ms or a tenth of the timeout, whichever is shorter: short test timeouts fire on time and
  // questions from other ranks are answered promptly.
  const auto poll =
      std::chrono::milliseconds(std::max<int64_t>(1, std::min<int64_t>(100, static_cast<int64_t>(timeout_s_ * 100))));
  uint64_t reported = ~uint64_t{0};  // the phase entry last reported: a handler that returns fires once per entry
  while (!stop_) {
    std::this_thread::sleep_for(poll);
    try {
      serve_requests();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ringtrain: rank %d: the watchdog cannot answer other ranks: %s\n", world_.rank(), e.what());
      peers_ = MPI_COMM_NULL;  // leaked rather than freed from here; the watchdog still guards this rank
    }
    const uint64_t generation = generation_.load();
    const auto since = Clock::time_point(Clock::duration(since_.load()));
    const double stuck = std::chrono::duration<double>(Clock::now() - since).count();
    if (stuck > timeout_s_ && !stop_ && !paused_.load() && generation != reported) {
      reported = generation;
      std::string message = report(stuck);
      if (std::strstr(phase_.load(), "waiting") != nullptr && peers_ != MPI_COMM_NULL) {
        try {
          message += ask_the_others();
        } catch (const std::exception& e) {
          message += detail::str_cat(" (asking the other ranks failed: ", e.what(), ")");
        }
      }
      on_stuck_(message);
    }
  }
}

// Answers every question that has arrived with this rank's phase, step and time in it.
void Watchdog::serve_requests() {
  if (peers_ == MPI_COMM_NULL) return;
  replies_.remove_if([](Reply& r) {
    int done = 0;
    MPI_Test(&r.request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
  for (;;) {
    int arrived = 0;
    MPI_Status probe;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kAskTag, peers_, &arrived, &probe));
    if (!arrived) return;
    int64_t question = 0;
    MPI_CHECK(MPI_Recv(&question, 1, MPI_INT64_T, probe.MPI_SOURCE, kAskTag, peers_, MPI_STATUS_IGNORE));
    Reply& reply = replies_.emplace_back();  // kept until its send completes
    Status& status = reply.status;
    status.question = question;
    status.step = step_.load();
    status.seconds =
        std::chrono::duration<double>(Clock::now() - Clock::time_point(Clock::duration(since_.load()))).count();
    status.paused = paused_.load() ? 1 : 0;
    std::snprintf(status.phase, sizeof status.phase, "%s", phase_text().c_str());
    MPI_CHECK(MPI_Isend(&status, sizeof(Status), MPI_BYTE, probe.MPI_SOURCE, kAnswerTag, peers_, &reply.request));
  }
}

// Asks every other rank where it is (waiting up to 3 s, answering questions meanwhile) and names the
// ranks that have not arrived where this one waits.
std::string Watchdog::ask_the_others() {
  const int64_t question = ++question_;
  // The send buffer must outlive sends that a dead rank never takes: one small block per question, kept.
  auto* buffer = new int64_t(question);
  const int64_t my_step = step_.load();
  const int n = world_.size(), me = world_.rank();
  std::vector<MPI_Request> sent(static_cast<size_t>(n), MPI_REQUEST_NULL);
  for (int r = 0; r < n; ++r)
    if (r != me) MPI_CHECK(MPI_Isend(buffer, 1, MPI_INT64_T, r, kAskTag, peers_, &sent[static_cast<size_t>(r)]));
  std::vector<std::optional<Status>> answers(static_cast<size_t>(n));
  int missing = n - 1;
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  while (missing > 0 && Clock::now() < deadline) {
    serve_requests();  // two waiting ranks ask each other at once
    int arrived = 0;
    MPI_Status probe;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kAnswerTag, peers_, &arrived, &probe));
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    Status s;
    MPI_CHECK(MPI_Recv(&s, sizeof s, MPI_BYTE, probe.MPI_SOURCE, kAnswerTag, peers_, MPI_STATUS_IGNORE));
    auto& slot = answers[static_cast<size_t>(probe.MPI_SOURCE)];
    if (s.question != question || slot) continue;  // a late answer to an earlier question
    s.phase[sizeof s.phase - 1] = '\0';
    slot = s;
    --missing;
  }
  bool all_sent = true;
  for (MPI_Request& r : sent) {
    if (r == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) {
      all_sent = false;
      MPI_Request_free(&r);  // a question a dead rank never takes is let go (its buffer stays)
    }
  }
  if (all_sent) delete buffer;
  std::string named;
  int behind = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    const auto& a = answers[static_cast<size_t>(r)];
    const std::string who = detail::str_cat("rank ", r, " on host ", world_.hosts()[r]);
    if (!a) {
      named += detail::str_cat("; ", who, " does not answer (dead, or stuck outside the training loop)");
    } else if (a->step != my_step || std::strstr(a->phase, "waiting") == nullptr || a->paused) {
      named += detail::str_cat("; ", who, " has not arrived at step ", my_step, ": it is in ", a->phase, " of step ",
                               a->step, " for ", static_cast<int64_t>(a->seconds), " s");
    } else {
      continue;
    }
    if (++behind >= 8) {
      named += "; ...";
      break;
    }
  }
  if (named.empty()) return "; every other rank is waiting too (the ranks are not in the same collective)";
  return named;
}

}  // namespace ringtrain::runtime
