// layers/loss.cpp: CrossEntropyLoss.
#include "layers/loss.h"

#include "core/check.h"
#include "core/ops.h"

namespace ringtrain {

CrossEntropyLoss::CrossEntropyLoss(double label_smoothing) : label_smoothing_(label_smoothing) {
  RT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
           "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", label_smoothing);
}

Tensor CrossEntropyLoss::operator()(const Tensor& logits, const Tensor& labels) const {
  return cross_entropy(logits, labels, label_smoothing_);
}

}  // namespace ringtrain
