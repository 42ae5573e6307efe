// runtime/loop/reporter.h: what a run tells and how it measures itself. Rank 0 prints the startup line, progress
// lines (or the bar), the evaluation lines and the closing line, and writes the JSONL records (plan, train,
// gpu, eval, summary; runtime/telemetry/run_log.h); the StepTimer behind the figures lives here. The collectives it
// runs (the loss average of a report, GPU samples, the summary's gathers) are in the same order on every rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/world.h"
#include "runtime/config/options.h"
#include "runtime/config/plan.h"
#include "runtime/telemetry/gpu_telemetry.h"
#include "runtime/telemetry/run_log.h"
#include "runtime/telemetry/step_timer.h"

namespace ringtrain::runtime {

class Replica;
struct TrainResult;

// "node0 0-1, node1 2-3": each host with its ranks (ranges where consecutive), in order of first rank.
std::string ranks_by_host(const std::vector<std::string>& hosts);

class Reporter {
 public:
  using Clock = std::chrono::steady_clock;
  // Collective (rank 0 decides on the bar; GPU telemetry). An unwritable --log-jsonl is an error naming it.
  // `pipeline`: Pipeline::plan() with --pipeline-stages (the plan record's "pipeline"), else null.
  Reporter(const comm::World& world, const TrainerOptions& o, Device device, const RunPlan& plan,
           size_t gradient_buckets, nlohmann::json pipeline = nullptr, nlohmann::json memory = nullptr,
           nlohmann::json layout = nullptr);

  bool bar() const { return bar_; }
  StepTimer& timer() { return timer_; }
  int64_t steps_since_report() const { return timer_.interval_steps(); }

  // Rank 0: the data's warnings, the startup line, the supervisor's "plan" event; collective: the plan record
  // (every rank's optimizer-state bytes).
  void announce(const Replica& replica, int threads, const Cursor& at, const std::string& resumed_from,
                const std::string& run_id, const std::vector<std::string>& data_warnings);
  // A micro-batch's loss: the finite ones make the interval's mean and the last loss.
  void add_loss(double loss);
  // A step taken with --clip-grad-norm: its gradient norm before clipping, which the next report shows.
  void add_grad_norm(double norm) { grad_norm_ = norm; }
  // An f16 step skipped for non-finite gradients (the summary counts them).
  void step_skipped() { ++skipped_steps_; }
  // Collective: the interval's loss averaged over ranks; rank 0 prints the progress and writes the train
  // record; then the gpu record. Starts the next interval.
  // `extra` (an object) is merged into the train record (a pipeline's per-stage figures).
  void report(int64_t epoch, int64_t step, double lr, const nlohmann::json& extra = nullptr);
  // Rank 0: a record of its own (--profile's) into the JSONL log.
  void write_record(const nlohmann::json& record);
  // Ends the epoch's bar line.
  void end_epoch() const;
  // Rank 0: the evaluation's line and record.
  void evaluated(int64_t epoch, int64_t step, const EvalResult& e);

  // What the summary needs from the loop.
  struct Finish {
    Cursor at;
    int64_t first_step = 0;
    double elapsed_s = 0;
    const Replica* replica = nullptr;
    std::string resumed_from;
  };
  // Collective: every rank's peak memory and mean breakdown gathered; rank 0 writes the summary record and
  // prints the closing line. Returns the figures (the gathered ones on rank 0).
  TrainResult summarize(const Finish& f);

 private:
  const comm::World& world_;
  const TrainerOptions& o_;
  Device device_;
  const RunPlan& plan_;
  bool bar_;
  RunLog log_;
  GpuTelemetry gpu_;
  StepTimer timer_;
  nlohmann::json pipeline_;
  nlohmann::json memory_;  // the memory plan (runtime/memory/memory_plan.h), null when not predicted
  nlohmann::json layout_;  // --layout auto's plan (runtime/layout/layout_plan.h), null without
  int loss_rank_ = 0;      // whose losses the closing line shows: the last pipeline stage's first replica
  double interval_loss_ = 0, interval_weight_ = 0, last_loss_ = 0;
  std::optional<double> grad_norm_;  // of the last step taken (with --clip-grad-norm)
  int64_t skipped_steps_ = 0;
  std::optional<EvalResult> last_eval_;  // the summary's
  Clock::time_point interval_start_ = Clock::now();
};

}  // namespace ringtrain::runtime
