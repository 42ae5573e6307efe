// runtime/cluster/fault_injection.cpp: RINGTRAIN_INJECT parsing and the faults themselves.
#include "runtime/cluster/fault_injection.h"
#include "core/env.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/parse.h"

namespace ringtrain::runtime {
namespace {

int64_t parse_count(const std::string& text, const std::string& whole, const char* field, int64_t max) {
  const std::optional<int64_t> n = to_number<int64_t>(text);
  if (!n || *n < 0 || *n > max)
    RT_THROW("RINGTRAIN_INJECT: ", field, " must be a number from 0 to ", max, ", got '", text, "' in '", whole,
             "' (expected KIND:RANK:STEP, e.g. throw:1:2)");
  return *n;
}

}  // namespace

FaultInjection FaultInjection::parse(const std::string& s, int64_t this_attempt) {
  std::vector<std::string> fields;
  for (size_t from = 0;;) {
    const size_t colon = s.find(':', from);
    fields.push_back(s.substr(from, colon - from));
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  RT_CHECK(fields.size() == 3 || fields.size() == 4,
           "RINGTRAIN_INJECT: expected KIND:RANK:STEP[:ATTEMPT] (e.g. throw:1:2), got '", s, "'");
  FaultInjection f;
  const std::string& kind = fields[0];
  if (kind == "throw")
    f.kind = Kind::Throw;
  else if (kind == "desync")
    f.kind = Kind::Desync;
  else if (kind == "hang")
    f.kind = Kind::Hang;
  else if (kind == "hang-checkpoint")
    f.kind = Kind::HangCheckpoint;
  else if (kind == "stop")
    f.kind = Kind::Stop;
  else
    RT_THROW("RINGTRAIN_INJECT: unknown kind '", kind, "' in '", s,
             "' (expected throw, desync, hang, hang-checkpoint or stop)");
  f.rank = static_cast<int>(parse_count(fields[1], s, "RANK", 1 << 24));
  f.step = parse_count(fields[2], s, "STEP", int64_t{1} << 40);
  RT_CHECK(f.step >= 1, "RINGTRAIN_INJECT: STEP counts optimizer steps from 1, got 0 in '", s, "'");
  if (fields.size() == 4) f.attempt = parse_count(fields[3], s, "ATTEMPT", 1 << 20);
  RT_CHECK(f.kind != Kind::HangCheckpoint || f.rank == 0,
           "RINGTRAIN_INJECT: hang-checkpoint needs RANK 0 (rank 0 alone writes checkpoints), got '", s, "'");
  f.this_attempt = this_attempt;
  return f;
}

FaultInjection FaultInjection::from_env() {
  const int64_t attempt = restart_count();
  const std::optional<std::string> text = env_text("RINGTRAIN_INJECT");
  return text ? parse(*text, attempt) : FaultInjection{};  // set but empty: off
}

void FaultInjection::check_steps(int64_t total_steps) const {
  RT_CHECK(kind == Kind::None || step <= total_steps, "RINGTRAIN_INJECT: step ", step, " is past this run's last step ",
           total_steps, ", so the fault would never fire");
  RT_CHECK(kind != Kind::Stop || step < total_steps, "RINGTRAIN_INJECT: stop lands in the step after step ", step,
           ", and this run's last step is ", total_steps, ", so the fault would never fire");
}

void FaultInjection::check_cuda_graph(bool cuda_graph) const {
  RT_CHECK(kind != Kind::Stop || !cuda_graph,
           "RINGTRAIN_INJECT: stop lands between a step's micro-batches, which --cuda-graph replays in one launch; "
           "drop --cuda-graph or use hang");
}

void FaultInjection::check_world(int world_size) const {
  RT_CHECK(kind == Kind::None || rank < world_size, "RINGTRAIN_INJECT: rank ", rank, " does not exist: this job has ",
           world_size, " rank(s) (0 to ", world_size - 1, "), so the fault would never fire");
}

int64_t FaultInjection::after_step(int rank_here, int64_t step_now) const {
  if (!fires(rank_here, step_now)) return step_now;
  switch (kind) {
    case Kind::Throw:
      RT_THROW("injected failure at step ", step_now);
    case Kind::Desync:
      return step_now + 1;
    case Kind::Hang:
      std::this_thread::sleep_for(std::chrono::hours(1));
      return step_now;
    case Kind::HangCheckpoint:
    case Kind::Stop:
    case Kind::None:
      break;
  }
  return step_now;
}

void FaultInjection::in_checkpoint_write(int rank_here, int64_t step_now) const {
  if (kind != Kind::HangCheckpoint || !armed(rank_here, step_now)) return;
  std::fprintf(stderr, "ringtrain: injected hang inside the write of the step-%lld checkpoint (RINGTRAIN_INJECT)\n",
               static_cast<long long>(step_now));
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::hours(1));
}

void FaultInjection::after_forward(int rank_here, int64_t step_now, int64_t micro) const {
  if (kind != Kind::Stop || micro != 0 || !armed(rank_here, step_now)) return;
  std::fprintf(stderr,
               "ringtrain: rank %d stops itself (SIGSTOP) at step %lld, after micro-batch 0's forward "
               "(RINGTRAIN_INJECT)\n",
               rank_here, static_cast<long long>(step_now));
  std::fflush(stderr);
  std::raise(SIGSTOP);  // every thread of the process, as a frozen host; SIGCONT goes on, SIGKILL ends it
}

}  // namespace ringtrain::runtime
