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
  EvalSums sums;
  CrossEntropyLoss loss_fn(options.label_smoothing);
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

void EvalSums::score(const Tensor& logits, const Tensor& labels, const CrossEntropyLoss& loss_fn) {
  const int64_t n = labels.numel();
  RT_CHECK(logits.ndim() == 2 && logits.size(0) == n, "evaluate: the logits of ", n, " images must be (", n,
           ", classes), got ", logits.shape());
  loss += loss_fn(logits, labels).item() * static_cast<double>(n);
  Tensor host = logits.to(Device::cpu()).to(DType::F32);
  Tensor lab = labels.to(Device::cpu()).to(DType::I64);
  const int64_t classes = host.size(1);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = host.data<float>() + i * classes;
    const int64_t label = lab.data<int64_t>()[i];
    const float target = row[label];
    // Rank of the true class: classes scoring higher, ties broken by index; a non-finite score is wrong.
    int64_t above = std::isfinite(target) ? 0 : classes;
    for (int64_t c = 0; c < classes && above < classes; ++c)
      above += (row[c] > target || (row[c] == target && c < label) || std::isnan(row[c])) ? 1 : 0;
    top1 += above == 0 ? 1 : 0;
    top5 += above < 5 ? 1 : 0;
  }
  count += static_cast<double>(n);
}

EvalResult EvalSums::total(MPI_Comm comm) const {
  double sums[4] = {top1, top5, loss, count};
  comm::all_reduce(comm, std::span<double>(sums, 4));
  EvalResult r;
  r.count = static_cast<int64_t>(sums[3]);
  if (r.count > 0) {
    r.top1 = sums[0] / sums[3];
    r.top5 = sums[1] / sums[3];
    r.loss = sums[2] / sums[3];
  }
  return r;
}

}  // namespace ringtrain::runtime
