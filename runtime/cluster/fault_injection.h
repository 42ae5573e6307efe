// runtime/cluster/fault_injection.h: deterministic faults for the tests of a real run's failure paths
// (RINGTRAIN_INJECT=KIND:RANK:STEP[:ATTEMPT]): after optimizer step STEP, rank RANK throws ("throw"),
// reports the wrong step number at the check-in ("desync") or stops making progress ("hang", caught by the
// watchdog); "hang-checkpoint" makes rank RANK (the writer, 0) stop inside the write of step STEP's
// checkpoint, its data complete in the temporary file but not yet renamed (a kill then lands mid-write);
// "stop" makes rank RANK stop itself (SIGSTOP, its watchdog with it, as a frozen host would) after step
// STEP, in the next step after the forward of its first micro-batch (the watchdogs' "step STEP"), so its peers wait
// mid-step (a pipeline's neighbours for the stage's activations or gradients, data parallelism's ranks in the gradient
// all-reduce) and their watchdogs name what they wait for. ATTEMPT limits the fault to one attempt of a supervised run
// (RINGTRAIN_RESTART, set by ringtrain_run: 0 for the first launch, 1 for the first restart, ...), so "throw:1:5:0"
// fails once and the restart goes through; without it the fault fires on every attempt. A malformed value is an error
// naming the variable and what is wrong, never ignored.
#pragma once

#include <cstdint>
#include <string>

namespace ringtrain::runtime {

struct FaultInjection {
  enum class Kind : uint8_t { None, Throw, Desync, Hang, HangCheckpoint, Stop };
  Kind kind = Kind::None;
  int rank = -1;
  int64_t step = -1;
  int64_t attempt = -1;      // -1: every attempt
  int64_t this_attempt = 0;  // RINGTRAIN_RESTART

  // Parses `text` (the variable's value) for attempt `this_attempt`; errors name RINGTRAIN_INJECT.
  static FaultInjection parse(const std::string& text, int64_t this_attempt = 0);
  // From the environment (Kind::None when unset or empty); errors name RINGTRAIN_INJECT or RINGTRAIN_RESTART.
  static FaultInjection from_env();
  // A fault for a rank the job does not have would never fire: an error naming the variable and the ranks.
  void check_world(int world_size) const;
  // Nor would a fault after a step past the run's last (for "stop", at or past it: it needs a step after
  // STEP): an error naming the variable and the run's steps.
  void check_steps(int64_t total_steps) const;
  // A CUDA graph's replay runs the whole step in one launch, with no point between its micro-batches: "stop"
  // with --cuda-graph is an error naming both.
  void check_cuda_graph(bool cuda_graph) const;

  // Whether the fault fires on this rank after this step (the Trainer names the watchdog phase first, so
  // an injected hang is reported as one, with its step).
  bool fires(int rank_here, int64_t step_now) const {
    return (kind == Kind::Throw || kind == Kind::Desync || kind == Kind::Hang) && armed(rank_here, step_now);
  }
  // The "stop" fault: called after each micro-batch's forward with the optimizer steps done before it and
  // the micro-batch's index within its step; stops this process after micro-batch 0 once STEP are done.
  void after_forward(int rank_here, int64_t step_now, int64_t micro) const;
  // The hang-checkpoint fault: called by the checkpoint writer between its temporary file and the rename.
  void in_checkpoint_write(int rank_here, int64_t step_now) const;
  // Called by the Trainer after each optimizer step with the new step count; returns the step this rank
  // reports at the check-in (wrong for "desync"). Throws for "throw"; sleeps for an hour for "hang".
  int64_t after_step(int rank_here, int64_t step_now) const;

 private:
  bool armed(int rank_here, int64_t step_now) const {
    return rank_here == rank && step_now == step && (attempt < 0 || attempt == this_attempt);
  }
};

}  // namespace ringtrain::runtime
