// runtime/types.h: the small types the runtime's areas hand each other, in one place so that no area
// includes another's header only for a type: a model's loss function (StepFn), what an evaluation scored
// (EvalResult) and what a run did (TrainResult, fit()'s answer).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "data/loader.h"
#include "layers/module.h"

namespace ringtrain::runtime {

// A model's loss for one micro-batch (called under autocast). The default is cross-entropy (with
// label_smoothing) of model(images) against the labels.
using StepFn = std::function<Tensor(Module& model, const data::Batch& batch)>;

struct EvalResult {
  double top1 = 0, top5 = 0, loss = 0;
  int64_t count = 0;  // images scored, over all ranks (segmentation: pixels, the ignored ones not counted)
  // Segmentation: top1 is the pixel accuracy (top5 the pixels whose class is among their five best), miou the mean
  // over the classes present (in the labels or the predictions) of intersection over union.
  bool segmentation = false;
  double miou = 0;
};

struct TrainResult {
  int64_t steps = 0;      // optimizer steps done at the end (including those before a resume)
  int64_t steps_run = 0;  // in this process
  double train_loss = 0;  // the last finite micro-batch loss of rank 0
  std::optional<EvalResult> eval;
  double img_per_s = 0, median_step_s = 0, elapsed_s = 0;
  int64_t skipped_steps = 0;  // f16 steps skipped for non-finite gradients
  std::string resumed_from;   // the checkpoint this run started from, if any
};

}  // namespace ringtrain::runtime
