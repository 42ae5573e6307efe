// runtime/step/loss_log.cpp: see runtime/step/loss_log.h.
#include "runtime/step/loss_log.h"

#include <utility>

#include "core/autograd.h"
#include "core/check.h"

namespace ringtrain::runtime {

LossLog::LossLog(bool defer, int64_t capacity) : defer_(defer), capacity_(capacity) {
  RT_CHECK(capacity_ > 0, "LossLog: capacity must be positive, got ", capacity_);
}

void LossLog::add(const Tensor& loss, const Origin& origin, const Take& take) {
  RT_CHECK(loss.defined() && loss.numel() == 1, "LossLog: a loss is one element, got ",
           loss.defined() ? loss.describe() : std::string("an undefined tensor"));
  if (!defer_) {  // nothing is ever pending then
    take(origin, loss.item());
    return;
  }
  if (!buffer_.defined() || buffer_.device() != loss.device()) {
    flush(take);  // the other device's losses, if any
    buffer_ = Tensor::empty(Shape{capacity_}, DType::F64, loss.device());
  }
  if (pending() == capacity_) flush(take);
  NoGradGuard no_grad;
  // A copy on the stream (a conversion kernel, or a device-to-device copy): no host wait.
  Tensor slot = buffer_.slice(pending(), pending() + 1);
  slot.copy_(loss.detach().reshape(Shape{1}));
  origins_.push_back(origin);
}

void LossLog::flush(const Take& take) {
  if (origins_.empty()) return;
  // One host wait for all of them; origins_ is cleared first, so a `take` that throws leaves none behind.
  const std::vector<double> values = buffer_.slice(0, pending()).to_vector();
  std::vector<Origin> origins = std::move(origins_);
  origins_.clear();
  for (size_t i = 0; i < origins.size(); ++i) take(origins[i], values[i]);
}

}  // namespace ringtrain::runtime
