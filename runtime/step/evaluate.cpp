// runtime/step/evaluate.cpp: scoring and the cross-rank sums.
#include "runtime/step/evaluate.h"

#include <cmath>

#include "comm/host_collectives.h"
#include "core/autograd.h"
#include "core/check.h"
#include "layers/loss.h"

namespace ringtrain::runtime {

std::vector<std::vector<int64_t>> eval_share(int64_t test_size, int replica, int replicas, const EvalOptions& options) {
  RT_CHECK(options.batch > 0, "evaluate: batch must be positive, got ", options.batch);
  RT_CHECK(test_size > 0, "evaluate: the test split is empty (skip the evaluation instead)");
  return data::eval_batches(test_size, replica, replicas, options.batch);
}

EvalResult evaluate(Module& model, data::Loader& test_loader, int64_t test_size, const comm::World& world,
                    const EvalOptions& options) {
  const auto batches = eval_share(test_size, world.rank(), world.size(), options);
  EvalScope scope(model);
  test_loader.start(batches, options.epoch);
  EvalSums sums = options.classes > 0 ? EvalSums(options.classes) : EvalSums();
  CrossEntropyLoss loss_fn({.label_smoothing = options.label_smoothing, .ignore_index = options.ignore_index});
  while (auto b = test_loader.next()) {
    if (options.on_batch) options.on_batch();
    if (b->valid == 0) continue;
    Tensor images = b->images.slice(0, b->valid), labels = b->labels.slice(0, b->valid);
    Tensor logits = options.logits ? options.logits(model, images) : model(images);
    sums.score(logits, labels, loss_fn);
  }
  if (options.on_wait) options.on_wait();
  return sums.total(world.comm());
}

namespace {

// How many classes score above `label` in a row of logits (ties broken by index; a non-finite score is wrong):
// 0 is a top-1 hit, below 5 a top-5 one.
int64_t rank_of(const float* row, int64_t classes, int64_t label) {
  const float target = row[label];
  int64_t above = std::isfinite(target) ? 0 : classes;
  for (int64_t c = 0; c < classes && above < classes; ++c)
    above += (row[c] > target || (row[c] == target && c < label) || std::isnan(row[c])) ? 1 : 0;
  return above;
}

// The predicted class of a row (its first maximum), or -1 when a score is not finite (never right).
int64_t predicted(const float* row, int64_t classes) {
  int64_t best = 0;
  for (int64_t c = 0; c < classes; ++c) {
    if (!std::isfinite(row[c])) return -1;
    if (row[c] > row[best]) best = c;
  }
  return best;
}

}  // namespace

void EvalSums::score(const Tensor& logits, const Tensor& labels, const CrossEntropyLoss& loss_fn) {
  const bool segmentation = labels.ndim() > 1;
  const int64_t n = labels.numel();
  RT_CHECK(logits.ndim() == labels.ndim() + 1 && logits.numel() / std::max<int64_t>(1, logits.size(-1)) == n,
           "evaluate: the logits ", logits.shape(), " do not fit the labels ", labels.shape(),
           segmentation ? " (a segmentation model's logits are (N, H, W, classes))" : " (logits are (N, classes))");
  RT_CHECK(!segmentation || !intersection.empty(), "evaluate: per-pixel labels ", labels.shape(),
           " need the classes of the mean IoU (EvalOptions::classes)");
  Tensor host = logits.to(Device::cpu()).to(DType::F32);
  Tensor lab = labels.to(Device::cpu()).to(DType::I64);
  const int64_t classes = host.size(-1);
  const std::optional<int64_t> ignore = loss_fn.options().ignore_index;
  int64_t scored = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = lab.data<int64_t>()[i];
    if (ignore && label == *ignore) continue;
    RT_CHECK(label >= 0 && label < classes, "evaluate: label ", label, " is outside [0, ", classes, ")");
    const float* row = host.data<float>() + i * classes;
    const int64_t above = rank_of(row, classes, label);
    top1 += above == 0 ? 1 : 0;
    top5 += above < 5 ? 1 : 0;
    ++scored;
    if (!segmentation) continue;
    RT_CHECK(classes <= static_cast<int64_t>(intersection.size()), "evaluate: ", classes,
             " classes of logits, the mean IoU counts ", intersection.size());
    const int64_t p = predicted(row, classes);
    intersection[static_cast<size_t>(label)] += p == label ? 1 : 0;
    union_[static_cast<size_t>(label)] += 1;
    if (p >= 0 && p != label) union_[static_cast<size_t>(p)] += 1;
  }
  // The loss is a mean over the pixels (or images) it counted: as a sum, the pass's mean is exact.
  if (scored > 0) loss += loss_fn(logits, labels).item() * static_cast<double>(scored);
  count += static_cast<double>(scored);
}

EvalResult EvalSums::total(MPI_Comm comm) const {
  std::vector<double> sums{top1, top5, loss, count};
  sums.insert(sums.end(), intersection.begin(), intersection.end());
  sums.insert(sums.end(), union_.begin(), union_.end());
  comm::all_reduce(comm, std::span<double>(sums));
  EvalResult r;
  r.count = static_cast<int64_t>(sums[3]);
  if (r.count > 0) {
    r.top1 = sums[0] / sums[3];
    r.top5 = sums[1] / sums[3];
    r.loss = sums[2] / sums[3];
  }
  r.segmentation = !intersection.empty();
  if (r.segmentation) {
    const size_t k = intersection.size();
    double iou = 0;
    int present = 0;
    for (size_t c = 0; c < k; ++c) {
      if (sums[4 + k + c] <= 0) continue;  // a class neither labelled nor predicted
      iou += sums[4 + c] / sums[4 + k + c];
      ++present;
    }
    r.miou = present > 0 ? iou / present : 0;
  }
  return r;
}

}  // namespace ringtrain::runtime
