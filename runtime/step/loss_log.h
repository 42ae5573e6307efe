// runtime/step/loss_log.h: the micro-batches' losses between two reads by the host. On the GPU a step must not
// wait for the device (docs/GPU.md: no host wait in a steady step), so each loss is copied, on the stream,
// into a device buffer, and the host reads the buffer once, where the loop needs the values anyway: at a
// report, a checkpoint and an epoch's end. That read also runs the checks the device left pending (the
// cross-entropy label check, core/device.h). On the CPU reading a loss costs nothing and every loss is read
// at once. The trainer turns a non-finite value into its error when it reads it, naming the step.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace ringtrain::runtime {

class LossLog {
 public:
  // Where a loss came from.
  struct Origin {
    int64_t epoch = 0, step = 0, micro = 0;
  };
  // `defer`: keep losses on the device until flush(); `capacity`: how many fit before add() reads them.
  explicit LossLog(bool defer, int64_t capacity = 256);

  // One micro-batch's loss (a single element of any floating dtype, on any device). Without deferral
  // (or when the buffer is full) it reads the pending losses first and hands each to `take`.
  using Take = std::function<void(const Origin&, double)>;
  void add(const Tensor& loss, const Origin& origin, const Take& take);
  // Reads every pending loss with one copy to the host and hands each, in order, to `take`.
  void flush(const Take& take);
  int64_t pending() const { return static_cast<int64_t>(origins_.size()); }
  bool deferred() const { return defer_; }

 private:
  bool defer_;
  int64_t capacity_;
  Tensor buffer_;  // F64 [capacity] on the losses' device, made on first use
  std::vector<Origin> origins_;
};

}  // namespace ringtrain::runtime
