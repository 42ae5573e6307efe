// layers/loss.h: softmax cross-entropy with label smoothing, as a callable (fused kernel in core/ops).
#pragma once

#include "core/tensor.h"

namespace ringtrain {

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(double label_smoothing = 0.0);
  // logits: (N, C) floating; labels: (N) i32/i64 in [0, C). Mean over N; f32 for 16-bit logits.
  Tensor operator()(const Tensor& logits, const Tensor& labels) const;
  double label_smoothing() const { return label_smoothing_; }

 private:
  double label_smoothing_;
};

}  // namespace ringtrain
