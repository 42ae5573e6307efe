// Runs under mpirun with 1, 2, 3 and 4 ranks. Data parallelism is exact: N ranks with batch B each on
// disjoint slices train the same parameters as one process with batch N*B on their union (a model
// without BatchNorm, and one with SyncBatchNorm), parameters are bitwise identical on every rank after
// every step, no_sync accumulation equals one larger batch, and misuse is an error naming the parameter
// or the rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "comm/grad_sync.h"
#include "comm/sync_batchnorm.h"
#include "comm/world.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "layers/basic.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/pooling.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace ringtrain::comm {
namespace {

constexpr int64_t kPerRank = 4, kHW = 6, kCh = 3, kClasses = 5;

std::shared_ptr<Sequential> make_model(bool with_bn, uint64_t seed = 7) {
  manual_seed(seed);
  Conv2dOptions c;
  c.padding = 1;
  if (with_bn) {
    return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<Conv2d>(kCh, 8, c), std::make_shared<BatchNorm2d>(8), std::make_shared<ReLU>(),
        std::make_shared<GlobalAvgPool>(), std::make_shared<Linear>(8, kClasses)});
  }
  c.bias = Bias::With;
  return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(kCh, 8, c), std::make_shared<ReLU>(), std::make_shared<GlobalAvgPool>(),
      std::make_shared<Linear>(8, kClasses)});
}

// The global batch of step `step` (identical on every rank), and rank r's slice of it.
Tensor images(int step, int world) { return Tensor::normal(Shape{kPerRank * world, kHW, kHW, kCh}, 0, 1, 100 + step); }
Tensor labels(int world) {
  std::vector<double> y(kPerRank * world);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<double>((i * 3) % kClasses);
  return Tensor::from_vector(y, Shape{kPerRank * world}, DType::I64);
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  Tensor x = a.to(DType::F64), y = b.to(DType::F64);
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = std::abs(x.data<double>()[i] - y.data<double>()[i]);
    worst = std::max(worst, d / std::max(1e-3, std::abs(y.data<double>()[i])));
  }
  return worst;
}

// True when every rank holds the same bytes in every tensor.
bool identical_on_every_rank(const std::vector<std::pair<std::string, Tensor>>& tensors, std::string& first_diff) {
  World& w = World::init();
  for (const auto& [name, t] : tensors) {
    uint64_t mine = fingerprint(t), lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, w.comm());
    MPI_Allreduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, w.comm());
    if (lo != hi) {
      first_diff = name;
      return false;
    }
  }
  return true;
}

CommunicatorPtr ring() { return make_communicator(Backend::Ring, World::init().comm()); }

// Trains `model` (on `device`, gradients averaged by `backend`) on this rank's slice of each global batch
// and a CPU reference on the whole batch; after every step they must agree within `tolerance` and the
// parameters must be bitwise identical on every rank.
void train_and_compare(bool with_bn, GradSyncOptions options, double tolerance, Device device = Device::cpu(),
                       Backend backend = Backend::Ring, CommOptions comm_options = {}) {
  World& w = World::init();
  const int n = w.size(), r = w.rank();
  auto reference = make_model(with_bn);
  auto model = make_model(with_bn);
  model->to(device);
  CommunicatorPtr comm = make_communicator(backend, w.comm(), comm_options);
  if (with_bn) {
    EXPECT_EQ(convert_sync_batchnorm(*model, comm), 1);
  }
  GradSync sync(*model, comm, options);
  Sgd ref_opt(as_named(reference->named_parameters()), SgdOptions{.momentum = 0.9, .weight_decay = 1e-3});
  Sgd opt(as_named(model->named_parameters()), SgdOptions{.momentum = 0.9, .weight_decay = 1e-3});
  CrossEntropyLoss loss_fn;
  const Tensor y = labels(n);
  for (int step = 0; step < 4; ++step) {
    const Tensor x = images(step, n);
    ref_opt.zero_grad();
    loss_fn((*reference)(x), y).backward();
    ref_opt.step(0.1);

    sync.zero_grad();
    const Tensor my_x = x.slice(r * kPerRank, (r + 1) * kPerRank).to(device);
    const Tensor my_y = y.slice(r * kPerRank, (r + 1) * kPerRank).to(device);
    loss_fn((*model)(my_x), my_y).backward();
    sync.finish();
    opt.step(0.1);

    auto mine = model->state_dict();
    const auto theirs = reference->state_dict();
    for (auto& entry : mine) entry.second = entry.second.to(Device::cpu());
    for (size_t i = 0; i < mine.size(); ++i) {
      if (!is_floating(mine[i].second.dtype())) continue;
      EXPECT_LT(max_rel_diff(mine[i].second, theirs[i].second), tolerance)
          << "step " << step << ": " << mine[i].first << " on " << device << " differs from the 1-rank batch-"
          << n * kPerRank << " CPU run";
    }
    std::string diff;
    EXPECT_TRUE(identical_on_every_rank(mine, diff)) << "step " << step << ": " << diff;
  }
}

TEST(GradSync, RanksTrainLikeOneProcessOnTheUnionBatch) { train_and_compare(false, {}, 2e-5); }

TEST(GradSync, SyncBatchNormTrainsLikeOneProcessOnTheUnionBatch) { train_and_compare(true, {}, 5e-5); }

// The node-aware all-reduce behind the same GradSync: on nodes emulated as 2 ranks each (2x2 on 4 ranks),
// and on the real nodes (one host here; 2 nodes x 2 ranks when the emulated cluster runs this suite).
TEST(GradSync, HierarchicalAllReduceTrainsLikeOneProcess) {
  CommOptions two;
  two.node_size = 2;
  train_and_compare(false, {}, 2e-5, Device::cpu(), Backend::Hierarchical, two);
  train_and_compare(true, {}, 5e-5, Device::cpu(), Backend::Hierarchical, two);
  train_and_compare(false, {}, 2e-5, Device::cpu(), Backend::Hierarchical);
}

TEST(GradSync, SmallBucketsAndNoOverlapGiveTheSameResult) {
  GradSyncOptions o;
  o.first_bucket_mb = o.bucket_mb = 1e-4;  // ~100 bytes: one bucket per parameter
  o.overlap = false;
  train_and_compare(false, o, 2e-5);
}

TEST(GradSync, Bf16CompressionStaysCloseAndIdenticalOnEveryRank) {
  GradSyncOptions o;
  o.compression = Compression::BF16;
  train_and_compare(false, o, 3e-2);
}

// On the GPU (tolerance: CUDA vs CPU kernels, accumulated over 4 steps). The ring stages the buckets
// through pinned host memory, so any number of ranks may share one GPU; NCCL needs one GPU per rank.
// With TF32 off the GPU computes in f32 like the CPU (f32 tolerance). With it on (the default, --tf32 on)
// each product's operands keep 10 mantissa bits: relative rounding up to 2^-11 on each of the two, growing
// like sqrt(K) over a reduction of K terms; the longest here is the filter gradient's, over N*P*Q positions
// of the whole batch (4 per rank x 6 x 6, at most 2 ranks' worth per GPU reduction in these runs).
// The first GPU run measured 3.4e-4 to 2.7e-3 with TF32 on against 2e-4 allowed.
const double kTf32Tolerance = 2 * std::ldexp(1.0, -11) * std::sqrt(2.0 * kPerRank * kHW * kHW);

// Restores TF32's setting when a test ends.
struct Tf32 {
  explicit Tf32(bool on) { set_allow_tf32(on); }
  ~Tf32() { set_allow_tf32(true); }
};

TEST(GradSyncGpu, RingRanksSharingTheGpuTrainLikeOneCpuProcess) {
  RT_REQUIRE_CUDA();
  {
    Tf32 off(false);
    train_and_compare(false, {}, 2e-4, Device::cuda(0), Backend::Ring);
    train_and_compare(true, {}, 2e-4, Device::cuda(0), Backend::Ring);
  }
  train_and_compare(false, {}, kTf32Tolerance, Device::cuda(0), Backend::Ring);
  train_and_compare(true, {}, kTf32Tolerance, Device::cuda(0), Backend::Ring);
}

TEST(GradSyncGpu, NcclTrainsLikeOneCpuProcess) {
  RT_REQUIRE_CUDA();
  World& w = World::init();
  if (w.local_size() > cuda_device_count())
    GTEST_SKIP() << "NCCL needs one GPU per rank: " << w.local_size() << " ranks, " << cuda_device_count() << " GPU(s)";
  const Device mine = w.bind(Device::cuda(0)).device;  // this rank's GPU: local rank % GPUs
  {
    Tf32 off(false);
    train_and_compare(false, {}, 2e-4, mine, Backend::Nccl);
    train_and_compare(true, {}, 2e-4, mine, Backend::Nccl);
  }
  train_and_compare(false, {}, kTf32Tolerance, mine, Backend::Nccl);
  train_and_compare(true, {}, kTf32Tolerance, mine, Backend::Nccl);
}

TEST(GradSync, BucketsAreReverseOrderViewsAndLaunchDuringBackward) {
  auto model = make_model(false);
  GradSyncOptions o;
  o.first_bucket_mb = 100.0 / (1 << 20);  // 100 bytes: only the last small tensor fits
  o.bucket_mb = 1.0;
  GradSync sync(*model, ring(), o);
  const auto& b = sync.buckets();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].parameters, std::vector<std::string>{"3.bias"});
  EXPECT_EQ(b[1].parameters, (std::vector<std::string>{"3.weight", "0.bias", "0.weight"}));
  EXPECT_EQ(b[0].bytes + b[1].bytes, model->num_parameters() * 4);
  // Gradients are views into the buckets: backward writes where the all-reduce reads.
  const auto params = model->named_parameters();
  const Tensor g0 = params[0].second.grad();
  sync.zero_grad();
  CrossEntropyLoss loss_fn;
  loss_fn((*model)(images(0, 1)), labels(1)).backward();
  EXPECT_EQ(params[0].second.grad().data_ptr(), g0.data_ptr());
  sync.finish();
  EXPECT_EQ(sync.last_buckets_launched_early(), 2);
}

// Counts the all-reduces a GradSync of one rank (MPI_COMM_SELF) hands its communicator.
class CountingComm final : public Communicator {
 public:
  CountingComm() : Communicator(MPI_COMM_SELF) {}
  ~CountingComm() override { free_comm(); }
  Backend backend() const override { return Backend::Ring; }
  WorkPtr all_reduce_async(const Tensor&, ReduceOp) override {
    ++all_reduces;
    return done();
  }
  WorkPtr broadcast_async(const Tensor&, int) override { return done(); }
  WorkPtr all_gather_async(const Tensor&, const Tensor&) override { return done(); }
  WorkPtr reduce_scatter_async(const Tensor&, const Tensor&, ReduceOp) override { return done(); }
  void barrier() override {}
  void close() override {}
  bool release_local() noexcept override { return true; }
  int all_reduces = 0;

 private:
  struct Done final : Work {
    void wait() override {}
    bool test() override { return true; }
  };
  static WorkPtr done() { return std::make_shared<Done>(); }
};

// One rank's average is its gradient: nothing goes to the communicator (a step of one GPU then waits for no
// communicator's events, and a CUDA graph can capture it), and the gradients are backward's own. With
// compression the wire's rounding is part of the result, so that still runs.
TEST(GradSync, OneRankLaunchesNothingUnlessCompressing) {
  for (const bool compress : {false, true}) {
    auto model = make_model(false), reference = make_model(false);
    auto counting = std::make_shared<CountingComm>();
    GradSyncOptions o;
    o.bucket_mb = 100.0 / (1 << 20);
    if (compress) o.compression = Compression::BF16;
    GradSync sync(*model, counting, o);
    sync.zero_grad();
    CrossEntropyLoss loss_fn;
    loss_fn((*model)(images(0, 1)), labels(1)).backward();
    sync.finish();
    if (compress) {
      EXPECT_EQ(counting->all_reduces, static_cast<int>(sync.buckets().size()));
      continue;
    }
    EXPECT_EQ(counting->all_reduces, 0);
    loss_fn((*reference)(images(0, 1)), labels(1)).backward();
    const auto p = model->named_parameters(), r = reference->named_parameters();
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_EQ(p[i].second.grad().to_vector(), r[i].second.grad().to_vector()) << p[i].first;
  }
}

TEST(GradSync, NoSyncAccumulationEqualsOneLargerBatch) {
  World& w = World::init();
  const int k = 3, r = w.rank(), n = w.size();
  auto big = make_model(false), acc = make_model(false);
  GradSync big_sync(*big, ring()), acc_sync(*acc, ring());
  CrossEntropyLoss loss_fn;
  // The big batch: k micro-batches of kPerRank on this rank.
  Tensor x = Tensor::normal(Shape{k * kPerRank * n, kHW, kHW, kCh}, 0, 1, 55);
  std::vector<double> yv(k * kPerRank * n);
  for (size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<double>(i % kClasses);
  Tensor y = Tensor::from_vector(yv, Shape{static_cast<int64_t>(yv.size())}, DType::I64);
  const int64_t lo = r * k * kPerRank;
  big_sync.zero_grad();
  loss_fn((*big)(x.slice(lo, lo + k * kPerRank)), y.slice(lo, lo + k * kPerRank)).backward();
  big_sync.finish();

  acc_sync.zero_grad();
  for (int m = 0; m < k; ++m) {
    const int64_t a = lo + m * kPerRank, b = a + kPerRank;
    auto scaled = [&] { mul(loss_fn((*acc)(x.slice(a, b)), y.slice(a, b)), 1.0 / k).backward(); };
    if (m + 1 < k) {
      auto guard = acc_sync.no_sync();
      scaled();
      acc_sync.finish();  // a no-op inside no_sync
    } else {
      scaled();
    }
  }
  acc_sync.finish();
  const auto pb = big->named_parameters(), pa = acc->named_parameters();
  for (size_t i = 0; i < pb.size(); ++i)
    EXPECT_LT(max_rel_diff(pa[i].second.grad(), pb[i].second.grad()), 1e-5) << pb[i].first;
}

TEST(GradSync, GradientTwiceInOneStepNamesTheParameter) {
  auto model = make_model(false);
  // No overlap: the second backward accumulates into a bucket before the hook can refuse it, which must
  // not race with that bucket's all-reduce.
  GradSyncOptions o;
  o.overlap = false;
  GradSync sync(*model, ring(), o);
  CrossEntropyLoss loss_fn;
  sync.zero_grad();
  loss_fn((*model)(images(0, 1)), labels(1)).backward();
  const std::string e = testing::error_of([&] { loss_fn((*model)(images(0, 1)), labels(1)).backward(); });
  EXPECT_NE(e.find("parameter '3.bias' received its gradient twice in one step"), std::string::npos) << e;
  sync.finish();
}

TEST(GradSync, UnusedParameterIsAnErrorUnlessDeclared) {
  World& w = World::init();
  Linear used(4, 3), unused(4, 3);
  GradSync::Named params = {
      {"used.weight", used.weight()}, {"used.bias", used.bias()}, {"unused.weight", unused.weight()}};
  Tensor x = Tensor::normal(Shape{2, 4}, 0, 1, 3);
  {
    GradSync sync(params, {}, ring());
    sync.zero_grad();
    sum(used(x)).backward();
    const std::string e = testing::error_of([&] { sync.finish(); });
    EXPECT_NE(e.find("parameter 'unused.weight' received no gradient this step"), std::string::npos) << e;
    EXPECT_NE(e.find("allow_unused"), std::string::npos) << e;
  }
  GradSyncOptions o;
  o.allow_unused = true;
  GradSync sync(params, {}, ring(), o);
  sync.zero_grad();
  sum(used(x)).backward();
  sync.finish();
  EXPECT_EQ(sum(abs(unused.weight().grad())).item(), 0.0);
  EXPECT_NEAR(sum(used.bias().grad()).item(), 3 * 2, 1e-5) << "rank " << w.rank();
}

TEST(GradSync, RankWithDifferentWeightsIsNamed) {
  World& w = World::init();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const int odd = w.size() - 1;
  auto model = make_model(false, 7);
  if (w.rank() == odd) {
    NoGradGuard no_grad;
    Tensor(model->named_parameters()[2].second).add_(Tensor::full(Shape{kClasses, 8}, 0.5));  // 3.weight
  }
  GradSyncOptions o;
  o.broadcast_parameters = false;
  const std::string e = testing::error_of([&] { GradSync sync(*model, ring(), o); });
  EXPECT_NE(e.find("weight check"), std::string::npos) << e;
  EXPECT_NE(e.find("failed on rank " + std::to_string(odd)), std::string::npos) << e;
  EXPECT_NE(e.find("parameter '3.weight' holds different values than on rank 0"), std::string::npos) << e;
  // With the default broadcast, the same ranks start from rank 0's weights.
  GradSync sync(*model, ring());
  std::string diff;
  EXPECT_TRUE(identical_on_every_rank(model->named_parameters(), diff)) << diff;
}

TEST(GradSync, RankWithADifferentModelIsNamed) {
  World& w = World::init();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const int odd = w.size() - 1;
  Linear a(4, w.rank() == odd ? 5 : 3);
  const std::string e = testing::error_of([&] { GradSync sync(a.named_parameters(), {}, ring()); });
  EXPECT_NE(e.find("model check"), std::string::npos) << e;
  EXPECT_NE(e.find("failed on rank " + std::to_string(odd)), std::string::npos) << e;
  EXPECT_NE(e.find("parameter 'weight' f32[5, 4] here but parameter 'weight' f32[3, 4] on rank 0"), std::string::npos)
      << e;
}

TEST(SyncBatchNorm, RunningStatisticsMatchTheUnionBatch) {
  World& w = World::init();
  const int n = w.size(), r = w.rank();
  BatchNorm2d local(4), synced(4);
  synced.set_cross_replica(make_cross_replica_sum(ring()));
  const Tensor x = Tensor::normal(Shape{3 * n, 2, 2, 4}, 1.5, 2.0, 9);
  local(x);
  Tensor out = synced(x.slice(3 * r, 3 * (r + 1)));
  EXPECT_LT(max_rel_diff(synced.running_mean(), local.running_mean()), 1e-5);
  EXPECT_LT(max_rel_diff(synced.running_var(), local.running_var()), 1e-5);
  // Eval uses the running statistics, like plain BatchNorm.
  synced.eval();
  local.eval();
  EXPECT_LT(max_rel_diff(synced(x), local(x)), 1e-5);
}

}  // namespace
}  // namespace ringtrain::comm
