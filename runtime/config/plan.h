// runtime/config/plan.h: the shape of a training run and the loop's policies, as pure functions of the options and
// the data's size (no MPI, no files, no clock), so each is unit-tested on its own (tests/runtime/test_plan.cpp):
//   RunPlan        batches, steps per epoch, total steps and epochs                     plan_run
//   learning rate  the schedule of the run (linear scaling, warmup, step/multistep/cosine) schedule_for
//   Cursor         where a run stands: optimizer steps done, and where the next step's data starts
//   cadence        after a step: report? checkpoint? stop?                               after_step
//                  after an epoch: evaluate? checkpoint?                                 after_epoch
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "optim/optimizer.h"
#include "runtime/config/options.h"

namespace ringtrain::runtime {

struct DataInfo;

struct RunPlan {
  int64_t batch = 0;            // images per rank per micro-batch (-b)
  int64_t accum = 1;            // micro-batches per optimizer step
  int64_t per_step_global = 0;  // images in one sampler batch: batch x ranks (one micro-batch of every rank)
  int64_t global_batch = 0;     // images per optimizer step: per_step_global x accum
  int64_t steps_per_epoch = 0;
  // Sampler batches an epoch runs: steps_per_epoch x accum (a leftover that cannot fill a step is not run).
  int64_t micro_per_epoch = 0;
  int64_t total_steps = 0;  // --steps, else steps_per_epoch x --epochs
  int64_t epochs = 0;       // epochs the loop visits (with --steps: enough to hold them)
};

// The sampler of a run: its global batch is one micro-batch of every rank.
data::SamplerOptions sampler_options(const TrainerOptions& o, const DataInfo& info, int rank, int world_size);
// Errors (ringtrain::Error) name the flags: a global batch larger than the training split.
RunPlan plan_run(const TrainerOptions& o, const DataInfo& info, int world_size);

// --lr, times global batch / 256 with --lr-scaling linear.
double base_lr(const TrainerOptions& o, const RunPlan& plan);
// The schedule the run's optimizer steps follow. Errors name the flags (milestones not increasing, a
// cosine warmup that does not end before the run).
LrScheduleOptions schedule_for(const TrainerOptions& o, const RunPlan& plan);
// "--lr-milestones 30,60.5" -> {30, 60.5}; an error names the flag and the text.
std::vector<double> parse_milestones(const std::string& text);

struct Cursor {
  int64_t step = 0;             // optimizer steps done
  data::SamplerState position;  // where the next step's first micro-batch starts, in sampler batches
};
bool finished(const Cursor& at, const RunPlan& plan);

// What the loop does after optimizer step `step` (steps done, counting this one). The final checkpoint
// is written after the loop, so `checkpoint` is never set with `stop`.
struct AfterStep {
  bool report = false;      // progress line, train record (every --log-every steps; every step with the bar)
  bool checkpoint = false;  // every --checkpoint-every steps, or when --checkpoint-every-min came due
  bool stop = false;        // the run's last step
};
AfterStep after_step(const TrainerOptions& o, const RunPlan& plan, int64_t step, int64_t steps_since_report, bool bar,
                     bool time_checkpoint_due);

// What the loop does after the micro-batches of `epoch` (0-based). `stopped`: the run's last step was
// taken; `complete`: every micro-batch of the epoch ran; `saved_now`: a checkpoint of the current step
// exists already (written by the time cadence).
struct AfterEpoch {
  bool evaluate = false;    // every --eval-every epochs, at the last epoch and when the run stops
  bool checkpoint = false;  // with --checkpoint-every 0, at each completed epoch before the last
};
AfterEpoch after_epoch(const TrainerOptions& o, const RunPlan& plan, int64_t epoch, bool stopped, bool complete,
                       bool saved_now);

// --checkpoint-every-min: due when that many minutes passed since the last checkpoint (rank 0's clock).
bool time_checkpoint_due(const TrainerOptions& o, double seconds_since_last);

// Whether step `step` (steps done) counts in the run's time breakdown: the run's first step (allocations,
// caches) does not, unless it is the only one.
bool counts_in_breakdown(int64_t step, int64_t first_step, int64_t total_steps);

}  // namespace ringtrain::runtime
