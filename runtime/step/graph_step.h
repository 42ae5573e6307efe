// runtime/step/graph_step.h: --cuda-graph. After kGraphWarmupSteps steps op by op, the whole step (its
// micro-batches, the optimizer, the zeroed gradients) is captured once as a CUDA graph (core/device.h) and
// replayed at every later step, the step's batches copied into the graph's slots first. Steps the graph
// cannot run go op by op: batches of other shapes (an epoch's short last batch) and, for the rest of the
// run, a step that cannot be captured (an optimizer that cannot, dropout's host draws, a failed capture),
// each said once on stderr and in the JSONL log.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "runtime/step/op_by_op_step.h"

namespace ringtrain::runtime {

class GraphStep : public OpByOpStep {
 public:
  explicit GraphStep(StepContext context) : OpByOpStep(std::move(context)) {}

 protected:
  Micro micro_batches(int64_t epoch, int64_t step, int64_t& micro) override;

 private:
  // The graph is off from now on, for `why`: said on stderr and in the JSONL log.
  void off(int64_t step, const std::string& why);

  CudaGraph graph_;
  std::vector<data::Batch> slots_;  // the graph's micro-batches: each step's copied in, every replay reads them
  std::vector<Tensor> losses_;      // the micro-batches' losses, left by every replay
  std::string off_;                 // why the steps run op by op ("" while the graph may be used)
  std::function<void(bool capturing)> work_;  // what the graph captured
  int64_t step_ = 0;                          // the step it runs for (an emulated replay runs work_ again)
};

}  // namespace ringtrain::runtime
