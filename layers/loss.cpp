// layers/loss.cpp: CrossEntropyLoss.
#include "layers/loss.h"

#include "core/check.h"

namespace ringtrain {

CrossEntropyLoss::CrossEntropyLoss(double label_smoothing)
    : CrossEntropyLoss(CrossEntropyOptions{.label_smoothing = label_smoothing}) {}

CrossEntropyLoss::CrossEntropyLoss(CrossEntropyOptions options) : options_(std::move(options)) {
  RT_CHECK(options_.label_smoothing >= 0.0 && options_.label_smoothing <= 1.0,
           "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", options_.label_smoothing);
  RT_CHECK(!options_.weight.defined() || options_.weight.ndim() == 1, "CrossEntropyLoss: class weights ",
           options_.weight.describe(), " must be one per class");
}

Tensor CrossEntropyLoss::operator()(const Tensor& logits, const Tensor& labels) const {
  if (options_.weight.defined() && options_.weight.device() != logits.device()) {
    CrossEntropyOptions on_device = options_;
    on_device.weight = options_.weight.to(logits.device());
    return cross_entropy(logits, labels, on_device);
  }
  return cross_entropy(logits, labels, options_);
}

}  // namespace ringtrain
