// runtime/pipeline/pipelined_step.h: the step with --pipeline-stages: this stage's share of the step's
// micro-batches in the schedule's order (Pipeline::run_step, runtime/pipeline/pipeline.h); the rest of the step is
// StepRunner's (runtime/step/step_runner.h). Every stage knows from the plan whether the epoch has a whole step
// left, so all of them stop together.
#pragma once

#include <cstdint>

#include "runtime/pipeline/pipeline.h"
#include "runtime/step/step_runner.h"

namespace ringtrain::runtime {

class PipelinedStep : public StepRunner {
 public:
  PipelinedStep(StepContext context, Pipeline& pipeline) : StepRunner(std::move(context)), pipeline_(pipeline) {}

 protected:
  Micro micro_batches(int64_t epoch, int64_t step, int64_t& micro) override;
  void ended(double step_s) override { pipeline_.end_step(step_s); }

 private:
  Pipeline& pipeline_;
};

}  // namespace ringtrain::runtime
