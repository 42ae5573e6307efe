// layers/loss.h: softmax cross-entropy as a callable (the fused kernel in core/ops.h): label smoothing, an ignore
// index and class weights, over (N, C) logits or per pixel over (N, H, W, C) with (N, H, W) labels.
#pragma once

#include "core/ops.h"
#include "core/tensor.h"

namespace ringtrain {

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(double label_smoothing = 0.0);
  explicit CrossEntropyLoss(CrossEntropyOptions options);
  // logits: (N, ..., C) floating; labels: (N, ...) i32/i64 in [0, C) or the ignore index. The mean over the
  // labels not ignored (weighted by the class weights, as PyTorch's); f32 for 16-bit logits.
  Tensor operator()(const Tensor& logits, const Tensor& labels) const;
  double label_smoothing() const { return options_.label_smoothing; }
  const CrossEntropyOptions& options() const { return options_; }

 private:
  CrossEntropyOptions options_;
};

}  // namespace ringtrain
