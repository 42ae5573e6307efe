// runtime/fault_injection.h: deterministic faults for the tests of a real run's failure paths
// (RINGTRAIN_INJECT=KIND:RANK:STEP): after optimizer step STEP, rank RANK throws ("throw"), reports the
// wrong step number at the check-in ("desync") or stops making progress ("hang", caught by the watchdog).
// A malformed value is an error naming the variable and what is wrong, never ignored.
#pragma once

#include <cstdint>
#include <string>

namespace ringtrain::runtime {

struct FaultInjection {
  enum class Kind : uint8_t { None, Throw, Desync, Hang };
  Kind kind = Kind::None;
  int rank = -1;
  int64_t step = -1;

  // Parses `text` (the variable's value); errors name RINGTRAIN_INJECT.
  static FaultInjection parse(const std::string& text);
  // From the environment (Kind::None when unset).
  static FaultInjection from_env();

  // Whether the fault fires on this rank after this step (the Trainer names the watchdog phase first, so
  // an injected hang is reported as one, with its step).
  bool fires(int rank_here, int64_t step_now) const { return kind != Kind::None && rank_here == rank && step_now == step; }
  // Called by the Trainer after each optimizer step with the new step count; returns the step this rank
  // reports at the check-in (wrong for "desync"). Throws for "throw"; sleeps for an hour for "hang".
  int64_t after_step(int rank_here, int64_t step_now) const;
};

}  // namespace ringtrain::runtime
