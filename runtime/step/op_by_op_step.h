// runtime/step/op_by_op_step.h: the step op by op (the default): each of the step's micro-batches read, its
// forward and its backward run kernel by kernel, the gradients' all-reduce overlapped with the last backward
// (runtime/step/replica.h); the rest of the step is StepRunner's.
#pragma once

#include <cstdint>

#include "data/loader.h"
#include "runtime/step/step_runner.h"

namespace ringtrain::runtime {

class OpByOpStep : public StepRunner {
 public:
  explicit OpByOpStep(StepContext context) : StepRunner(std::move(context)) {}

 protected:
  Micro micro_batches(int64_t epoch, int64_t step, int64_t& micro) override;
  // One micro-batch's forward and backward (the k-th of the step, the epoch's micro-batch `micro`) on
  // `batch`, timed into the step: read from `read_start` to `read_end`, then computed.
  void micro_step(const data::Batch& batch, int64_t k, int64_t epoch, int64_t step, int64_t micro, Micro& m,
                  Clock::time_point read_start, Clock::time_point read_end);
};

}  // namespace ringtrain::runtime
