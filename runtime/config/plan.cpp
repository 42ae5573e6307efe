// runtime/config/plan.cpp: the run's shape, its learning-rate schedule and the loop's cadences.
#include "runtime/config/plan.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/check.h"
#include "core/parse.h"
#include "runtime/config/data_source.h"

namespace ringtrain::runtime {

data::SamplerOptions sampler_options(const TrainerOptions& o, const DataInfo& info, int rank, int world_size) {
  data::SamplerOptions so;
  so.dataset_size = info.train_size;
  so.global_batch = o.batch * world_size;
  so.rank = rank;
  so.world_size = world_size;
  so.seed = o.seed;
  so.chunk = info.chunk;
  return so;
}

RunPlan plan_run(const TrainerOptions& o, const DataInfo& info, int world_size) {
  RunPlan p;
  p.batch = o.batch;
  p.accum = o.accum;
  p.per_step_global = o.batch * world_size;
  p.global_batch = p.per_step_global * o.accum;
  const int64_t sampler_batches = data::DistributedSampler(sampler_options(o, info, 0, world_size)).batches_per_epoch();
  p.steps_per_epoch = sampler_batches / o.accum;
  RT_CHECK(p.steps_per_epoch > 0, "--batch-size ", o.batch, " x ", world_size, " ranks x --accum-steps ", o.accum,
           " = global batch ", p.global_batch, " is larger than the training split (", info.train_size, " records)");
  p.micro_per_epoch = p.steps_per_epoch * o.accum;
  p.total_steps = o.steps > 0 ? o.steps : p.steps_per_epoch * o.epochs;
  p.epochs = o.steps > 0 ? (p.total_steps + p.steps_per_epoch - 1) / p.steps_per_epoch : o.epochs;
  return p;
}

double base_lr(const TrainerOptions& o, const RunPlan& plan) {
  return o.lr_scaling == LrScaling::Linear ? o.lr * static_cast<double>(plan.global_batch) / 256.0 : o.lr;
}

std::vector<double> parse_milestones(const std::string& text) {
  return parse_number_list<double>("--lr-milestones (epochs)", text, {0.0, 1e6});
}

LrScheduleOptions schedule_for(const TrainerOptions& o, const RunPlan& plan) {
  const auto per_epoch = static_cast<double>(plan.steps_per_epoch);
  LrScheduleOptions lso;
  lso.base_lr = base_lr(o, plan);
  lso.total_steps = plan.total_steps;
  lso.warmup_steps = static_cast<int64_t>(o.warmup_epochs * per_epoch);
  lso.gamma = o.lr_gamma;
  lso.shape = o.lr_schedule;
  if (o.lr_schedule == LrShape::Step)
    lso.step_size = std::max<int64_t>(1, static_cast<int64_t>(o.lr_step_epochs * per_epoch));
  if (o.lr_schedule == LrShape::MultiStep) {
    const auto e = static_cast<double>(plan.epochs);
    const std::vector<double> m =
        o.lr_milestones.empty() ? std::vector<double>{0.5 * e, 0.75 * e} : parse_milestones(o.lr_milestones);
    for (double epoch : m) lso.milestones.push_back(static_cast<int64_t>(epoch * per_epoch));
    for (size_t i = 1; i < lso.milestones.size(); ++i)
      RT_CHECK(lso.milestones[i] > lso.milestones[i - 1], "--lr-milestones must be increasing epochs, got '",
               o.lr_milestones, "'");
  }
  RT_CHECK(lso.warmup_steps < plan.total_steps || lso.shape != LrShape::Cosine, "--warmup-epochs ", o.warmup_epochs,
           " (", lso.warmup_steps, " steps) must end before the run does (", plan.total_steps, " steps)");
  return lso;
}

bool finished(const Cursor& at, const RunPlan& plan) { return at.step >= plan.total_steps; }

AfterStep after_step(const TrainerOptions& o, const RunPlan& plan, int64_t step, int64_t steps_since_report, bool bar,
                     bool time_checkpoint_due) {
  AfterStep a;
  a.stop = step >= plan.total_steps;
  a.report = bar || a.stop || steps_since_report >= o.log_every;
  a.checkpoint = !a.stop && ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || time_checkpoint_due);
  return a;
}

AfterEpoch after_epoch(const TrainerOptions& o, const RunPlan& plan, int64_t epoch, bool stopped, bool complete,
                       bool saved_now) {
  AfterEpoch a;
  a.evaluate = (epoch + 1) % o.eval_every == 0 || stopped || epoch + 1 == plan.epochs;
  a.checkpoint = o.checkpoint_every == 0 && complete && !stopped && !saved_now;
  return a;
}

bool time_checkpoint_due(const TrainerOptions& o, double seconds_since_last) {
  return o.checkpoint_every_min > 0 && seconds_since_last >= 60 * o.checkpoint_every_min;
}

bool counts_in_breakdown(int64_t step, int64_t first_step, int64_t total_steps) {
  return step > first_step + 1 || total_steps - first_step == 1;
}

}  // namespace ringtrain::runtime
