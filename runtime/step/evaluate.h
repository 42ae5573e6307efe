// runtime/step/evaluate.h: exact evaluation of any classification or segmentation model on a test split across
// ranks. Every test image is scored exactly once over all ranks (data::eval_batches; the padding of the last
// rank's block is masked by Batch::valid), and the sums (top-1, top-5, loss, count; for segmentation also each
// class's intersection and union) are all-reduced, so the result equals one process scoring the whole split. A
// non-finite score counts as wrong.
#pragma once

#include <cstdint>
#include <functional>

#include "comm/world.h"
#include "core/autograd.h"
#include "core/tensor.h"
#include "data/loader.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "runtime/types.h"

namespace ringtrain::runtime {

struct EvalOptions {
  int64_t batch = 128;                                 // images per rank per forward
  double label_smoothing = 0;                          // of the reported loss
  std::optional<int64_t> ignore_index = std::nullopt;  // of the reported loss and (segmentation) the pixels scored
  int64_t classes = 0;  // segmentation: the classes of the mean IoU (every rank the same)
  int64_t epoch = 0;    // passed to the loader (deterministic transforms ignore it)
  // The logits (N, C) of a batch of images; default: model(images).
  std::function<Tensor(Module& model, const Tensor& images)> logits = {};
  // Called before each batch, and before the closing all-reduce (the Trainer names its watchdog phases).
  std::function<void()> on_batch = {};
  std::function<void()> on_wait = {};
};

// The sums an evaluation adds up (a rank's part), scored batch by batch: top-1 and top-5 hits, the summed
// loss, the images. total() all-reduces them over `comm` (collective) into the result.
struct EvalSums {
  double top1 = 0, top5 = 0, loss = 0, count = 0;
  // Segmentation (classes > 0): per class, the pixels both predicted and labelled it, and those either did.
  std::vector<double> intersection, union_;
  EvalSums() = default;
  explicit EvalSums(int64_t segmentation_classes)
      : intersection(static_cast<size_t>(segmentation_classes)), union_(static_cast<size_t>(segmentation_classes)) {}
  // logits (N, C) against labels (N); segmentation: (N, H, W, C) against (N, H, W), pixels labelled the loss's
  // ignore index skipped.
  void score(const Tensor& logits, const Tensor& labels, const CrossEntropyLoss& loss_fn);
  EvalResult total(MPI_Comm comm) const;
};

// An evaluation pass's scope: the model in eval mode and no gradients, back in train mode when it ends
// (also when a forward throws).
class EvalScope {
 public:
  explicit EvalScope(Module& model) : model_(model) { model_.eval(); }
  ~EvalScope() { model_.train(); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Module& model_;
  NoGradGuard no_grad_;
};

// Where every evaluation starts, with or without pipeline stages: this replica's share of the test split in
// batches of options.batch (data::eval_batches). Errors: a batch below 1, an empty test split (scoring
// nothing would report 0% as if it were a result).
std::vector<std::vector<int64_t>> eval_share(int64_t test_size, int replica, int replicas, const EvalOptions& options);

// Collective. Puts the model in eval mode for the pass and back in train mode after; no gradients.
// `test_size` is the split's record count (the same on every rank).
EvalResult evaluate(Module& model, data::Loader& test_loader, int64_t test_size, const comm::World& world,
                    const EvalOptions& options = {});

}  // namespace ringtrain::runtime
