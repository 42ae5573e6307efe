// Tests for runtime/memory/memory_plan.h: the prediction's terms follow the options (optimizer slots, ZeRO's 1/N,
// compression's wire, the batch), the probe measures a curve that grows with the batch and leaves the model
// as it was, on a caching allocator (CUDA's) the curve is the tensors' high-water mark of a bigger batch's
// first step, the remedies of an over-budget run each fit, and -b auto picks the largest batch that fits.
#include "runtime/memory/memory_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/check.h"
#include "core/ops.h"
#include "layers/loss.h"
#include "layers/models/resnet.h"
#include "layers/recompute.h"

namespace ringtrain::runtime {
namespace {

constexpr int64_t KiB = int64_t{1} << 10;
constexpr int64_t MiB = int64_t{1} << 20;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.nbytes())) == 0;
}

MemoryFacts facts() {
  MemoryFacts f;
  f.baseline = 200 * MiB;
  f.param_bytes = 100 * MiB;
  f.image_bytes = MiB;
  f.batches_in_flight = 2;
  f.curve = {10 * MiB, 20 * MiB};
  return f;
}

TrainerOptions sgd(int64_t batch) {
  TrainerOptions o;
  o.batch = batch;
  o.momentum = 0.9;
  return o;
}

TEST(MemoryPlan, TermsFollowTheOptions) {
  const MemoryFacts f = facts();
  TrainerOptions o = sgd(8);
  MemoryPrediction p = predict_peak(o, f, 1);
  EXPECT_EQ(p.baseline, 200 * MiB);
  EXPECT_EQ(p.gradients, 100 * MiB);
  EXPECT_EQ(p.optimizer_state, 100 * MiB);  // momentum
  EXPECT_EQ(p.wire, 0);
  EXPECT_EQ(p.activations, 10 * MiB + 8 * 20 * MiB);
  EXPECT_EQ(p.input, 2 * 8 * MiB);
  EXPECT_EQ(p.total, p.baseline + p.gradients + p.optimizer_state + p.activations + p.input);
  o.momentum = 0;
  EXPECT_EQ(predict_peak(o, f, 1).optimizer_state, 0);
  o.optimizer = OptimizerKind::AdamW;
  EXPECT_EQ(predict_peak(o, f, 1).optimizer_state, 200 * MiB);
  o.zero = 1;
  EXPECT_EQ(predict_peak(o, f, 4).optimizer_state, 50 * MiB);
  o.zero = 0;
  o.compression = comm::Compression::BF16;
  EXPECT_EQ(predict_peak(o, f, 2).wire, 50 * MiB);
  // Accumulation does not change a micro-batch's peak; the batch does, linearly.
  TrainerOptions a = sgd(8);
  a.accum = 4;
  EXPECT_EQ(predict_peak(a, f, 1).total, predict_peak(sgd(8), f, 1).total);
  EXPECT_EQ(predict_peak(sgd(16), f, 1).total - predict_peak(sgd(8), f, 1).total, 8 * (20 + 2) * MiB);
  // Recompute's heap gaps on the CPU: a fifth of its activations.
  TrainerOptions r = sgd(8);
  r.recompute = true;
  EXPECT_EQ(predict_peak(r, f, 1).heap_gap, p.activations / 5);
  // Never below what the process reached already.
  MemoryFacts high = f;
  high.peak_so_far = 10000 * MiB;
  EXPECT_EQ(predict_peak(sgd(8), high, 1).total, 10000 * MiB);
}

TEST(MemoryPlan, FitsLeavesFivePercent) {
  EXPECT_TRUE(fits(100 * MiB, 105 * MiB));
  EXPECT_FALSE(fits(100 * MiB, 104 * MiB));
}

TEST(MemoryPlan, RemediesEachFitAndKeepTheGlobalBatch) {
  const MemoryFacts f = facts();
  const TrainerOptions o = sgd(32);  // 200 + 100 + 100 + 10 + 640 + 64 = 1114 MiB
  const int64_t budget = 900 * MiB;
  ASSERT_GT(predict_peak(o, f, 2).total, budget);
  int probes = 0;
  // Recompute keeps a quarter of the activations, bf16 half of them.
  auto probe = [&](const TrainerOptions& v) {
    ++probes;
    ActivationCurve c = f.curve;
    if (v.recompute) c.per_image /= 4;
    if (v.precision == Precision::BF16) c.per_image /= 2;
    return c;
  };
  const std::vector<Remedy> r = remedies(o, f, 2, budget, probe);
  ASSERT_FALSE(r.empty());
  std::vector<std::string> flags;
  for (const Remedy& x : r) {
    flags.push_back(x.flags);
    EXPECT_TRUE(fits(x.prediction.total, budget)) << x.flags;
    EXPECT_EQ(x.prediction.total, predict_peak(
                                      x.options,
                                      [&] {
                                        MemoryFacts g = f;
                                        g.curve = probe(x.options);
                                        return g;
                                      }(),
                                      2)
                                      .total)
        << x.flags;
    const int64_t stages = x.options.pipeline_stages;
    EXPECT_EQ(x.options.batch * x.options.accum * 2 / stages, o.batch * o.accum * 2) << x.flags;
  }
  EXPECT_EQ(flags[0], "-b 16 --accum-steps 2");
  EXPECT_NE(std::find(flags.begin(), flags.end(), "--recompute"), flags.end());
  EXPECT_NE(std::find(flags.begin(), flags.end(), "--precision bf16"), flags.end());
  // --zero 1 saves 50 MiB of 1114: not enough alone, so not listed.
  EXPECT_EQ(std::find(flags.begin(), flags.end(), "--zero 1"), flags.end());
  EXPECT_GT(probes, 0);
}

TEST(MemoryPlan, CombinedRemedyWhenNoLeverAloneFits) {
  MemoryFacts f = facts();
  f.curve = {10 * MiB, 200 * MiB};  // batch 1 alone: 200+100+100+10+200+2 = 612 MiB
  const TrainerOptions o = sgd(2);
  auto probe = [&](const TrainerOptions& v) {
    ActivationCurve c = f.curve;
    if (v.recompute) c.per_image /= 4;
    if (v.precision == Precision::BF16) c.per_image /= 2;
    return c;
  };
  const std::vector<Remedy> r = remedies(o, f, 1, 470 * MiB, probe);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].flags, "--recompute --precision bf16 -b 1 --accum-steps 2");
  EXPECT_TRUE(fits(r[0].prediction.total, 470 * MiB));
  EXPECT_TRUE(remedies(o, f, 1, 100 * MiB, probe).empty());
}

TEST(MemoryPlan, AutoBatchIsTheLargestThatFits) {
  const MemoryFacts f = facts();
  TrainerOptions o = sgd(0);
  const int64_t budget = 1000 * MiB;
  const AutoBatch b = choose_batch(o, f, 1, budget, 1 << 20);
  TrainerOptions at = sgd(b.batch), above = sgd(b.batch + 1);
  EXPECT_TRUE(fits(predict_peak(at, f, 1).total, budget));
  EXPECT_FALSE(fits(predict_peak(above, f, 1).total, budget));
  EXPECT_EQ(b.accum, 1);
  EXPECT_EQ(choose_batch(o, f, 1, budget, 8).batch, 8);  // the data's cap
  // A global batch: the smallest accumulation whose micro-batch fits and divides it.
  o.global_batch = 256;
  const AutoBatch g = choose_batch(o, f, 2, budget, 1 << 20);
  EXPECT_EQ(g.batch * g.accum * 2, 256);
  EXPECT_LE(g.batch, b.batch);
  for (int64_t a = 1; a < g.accum; ++a)  // no smaller accumulation fits
    if (128 % a == 0) {
      EXPECT_FALSE(fits(predict_peak(sgd(128 / a), f, 2).total, budget)) << a;
    }
  o.global_batch = 255;
  EXPECT_THROW(choose_batch(o, f, 2, budget, 1 << 20), PermanentError);
  o.global_batch = 0;
  try {
    choose_batch(o, f, 1, 300 * MiB, 1 << 20);
    FAIL() << "expected a refusal";
  } catch (const PermanentError& e) {
    EXPECT_NE(std::string(e.what()).find("not even a micro-batch of 1"), std::string::npos) << e.what();
  }
}

TEST(MemoryPlan, ProbeGrowsWithTheBatchAndLeavesTheModelAsItWas) {
  manual_seed(3);
  auto model = std::make_shared<ResNet>("resnet20", ResNetOptions{.num_classes = 10});
  model->to(Device::cpu());
  model->train();
  DataInfo info;
  info.height = info.width = 16;
  info.channels = 3;
  info.classes = 10;
  TrainerOptions o = sgd(4);
  std::vector<Tensor> before;
  for (const auto& [n, b] : model->named_buffers()) before.push_back(b.clone());
  const uint64_t stream = rng_stream();
  const ActivationCurve plain = probe_activations(o, Device::cpu(), *model, info, {});
  EXPECT_GT(plain.per_image, 16 * 16 * 16 * 4);  // at least the first convolution's output
  EXPECT_EQ(rng_stream(), stream);
  const auto after = model->named_buffers();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(same_bits(after[i].second, before[i])) << after[i].first;
  for (const auto& [n, p] : model->named_parameters()) EXPECT_FALSE(p.grad().defined()) << n;
  recompute_blocks(*model);
  const ActivationCurve recomputed = probe_activations(o, Device::cpu(), *model, info, {});
  EXPECT_LT(recomputed.per_image, plain.per_image);
  recompute_blocks(*model, false);
  EXPECT_EQ(probe_activations(o, Device::cpu(), *model, info, {}).per_image, plain.per_image);
}

// A step function that fails after its forward (and a backward of its own) mid-probe: the probe's error
// reaches the caller, and the model is as it was (statistics, generator, gradients), so that a run that
// warns and goes on without a plan trains the model it was given.
TEST(MemoryPlan, ProbeThatThrowsLeavesTheModelAsItWas) {
  manual_seed(4);
  auto model = std::make_shared<ResNet>("resnet20", ResNetOptions{.num_classes = 10});
  model->to(Device::cpu());
  model->train();
  DataInfo info;
  info.height = info.width = 16;
  info.channels = 3;
  info.classes = 10;
  std::vector<Tensor> before;
  for (const auto& [n, b] : model->named_buffers()) before.push_back(b.clone());
  const uint64_t stream = rng_stream();
  int calls = 0;
  const StepFn failing = [&](Module& m, const data::Batch& batch) -> Tensor {
    Tensor loss = CrossEntropyLoss()(m(batch.images), batch.labels);
    if (++calls == 2) {  // the second pass's forward: the first pass's gradients are there by now
      loss.backward();
      RT_THROW("the step function failed after its forward");
    }
    return loss;
  };
  EXPECT_THROW(probe_activations(sgd(4), Device::cpu(), *model, info, failing), Error);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(rng_stream(), stream);
  const auto after = model->named_buffers();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(same_bits(after[i].second, before[i])) << after[i].first;
  for (const auto& [n, p] : model->named_parameters()) EXPECT_FALSE(p.grad().defined()) << n;
}

// Device memory that is never touched: distinct addresses for the caching allocator (CUDA's, core/allocator.h).
class AddressBackend final : public RawBackend {
 public:
  void* raw_allocate(int64_t nbytes) override {
    void* p = reinterpret_cast<void*>(next_);
    next_ += static_cast<uintptr_t>(nbytes) + 4096;
    return p;
  }
  bool raw_free(void*) noexcept override { return true; }
  int64_t device_total_bytes() const override { return 0; }
  std::string device_name() const override { return "cuda:9"; }

 private:
  uintptr_t next_ = 1 << 20;
};

// A network's forward and backward of b images as its tensors go through a caching allocator: weight copies
// (3 MiB, whatever the batch), activations kept for the backward (b x 256, 768 and 1024 KiB: 2 MiB an
// image), a temporary of b x 576 KiB freed before the 768 KiB one is asked for (which that block is too
// small to serve: the reserve holds both), and, the first time a batch size is seen, cuDNN's algorithm
// search: 64 MiB at the top of the pass, while every activation is alive (once per shape, as on a GPU).
struct FakeNet {
  CachingAllocator& alloc;
  std::set<int64_t> searched;
  void pass(int64_t b) {
    std::vector<void*> kept{alloc.allocate(3 * MiB, nullptr), alloc.allocate(b * 256 * KiB, nullptr)};
    alloc.free(alloc.allocate(b * 576 * KiB, nullptr));
    kept.push_back(alloc.allocate(b * 768 * KiB, nullptr));
    kept.push_back(alloc.allocate(b * 1024 * KiB, nullptr));
    if (searched.insert(b).second) alloc.free(alloc.allocate(64 * MiB, nullptr));
    for (auto it = kept.rbegin(); it != kept.rend(); ++it) alloc.free(*it);  // the backward lets them go
  }
};

// The GPU's term of the plan: on a caching allocator the probe's line is the tensors' high-water mark, each
// pass from an empty cache, so that it predicts the first step of a bigger batch (the plan's peak on CUDA,
// the algorithm search's workspace in the fixed part). Read off the reserve, as it once was, the second
// pass stood on the first one's blocks and the line counted both: ResNet-50 bf16 at batch 256 on an H200
// was predicted at 16.11 GiB for an 11.82 GiB tensor peak (docs/gpu_runs, shared/gpu/2026-12-04).
TEST(MemoryPlan, OnACachingAllocatorTheCurveIsTheTensorsPeakOfABiggerBatch) {
  CachingAllocator alloc(std::make_unique<AddressBackend>());
  FakeNet net{alloc, {}};
  ProbeMeter meter{[&] { return alloc.stats(); }, [&] { alloc.reset_peak(); }, [&] { alloc.empty_cache(); }};
  auto pass = [&](int64_t b) -> std::function<void()> { return [&net, b] { net.pass(b); }; };
  const ActivationCurve c = measure_curve(4, pass, meter);
  EXPECT_EQ(c.per_image, 2 * MiB);         // 256 + 768 + 1024 KiB: the temporary is not kept
  EXPECT_EQ(c.fixed, 3 * MiB + 64 * MiB);  // the weight copies and the search's workspace
  EXPECT_EQ(c.high_water, c.at(8));
  // The run: what the probe held given back (probe_activations), then the first step at 64 images, whose
  // new shapes are searched, and a steady one, which holds no search workspace.
  alloc.empty_cache();
  for (int step = 0; step < 2; ++step) {
    const int64_t before = alloc.stats().allocated_bytes;
    alloc.reset_peak();
    net.pass(64);
    const int64_t peak = alloc.stats().peak_allocated_bytes - before;
    EXPECT_EQ(peak, step == 0 ? c.at(64) : c.at(64) - 64 * MiB) << "step " << step;
  }
  MemoryFacts f = facts();
  f.cuda = true;
  f.curve = c;
  EXPECT_EQ(predict_peak(sgd(64), f, 1).activations, c.at(64));
  // What the reserve would have said: more than the tensors, and, with the first pass's blocks kept, more
  // again (the second pass's requests, twice as large, mostly cannot use them).
  FakeNet fresh{alloc, {}};
  auto fresh_pass = [&](int64_t b) -> std::function<void()> { return [&fresh, b] { fresh.pass(b); }; };
  ProbeMeter reserve = meter;
  reserve.stats = [&] {  // the cost of a pass: the reserve's high-water mark above the tensors held before
    AllocatorStats s = alloc.stats();
    s.peak_allocated_bytes = s.peak_reserved_bytes;
    return s;
  };
  alloc.empty_cache();
  EXPECT_GT(measure_curve(4, fresh_pass, reserve).per_image, c.per_image + c.per_image / 4);
  reserve.release_cache = {};
  fresh.searched.clear();
  alloc.empty_cache();
  EXPECT_GT(measure_curve(4, fresh_pass, reserve).per_image, 2 * c.per_image);
  // Kept blocks also serve larger requests than they were made for (up to 5/4), which counts them larger.
  ProbeMeter kept = meter;
  kept.release_cache = {};
  fresh.searched.clear();
  alloc.empty_cache();
  EXPECT_GT(measure_curve(4, fresh_pass, kept).per_image, c.per_image);
}

// On a GPU (skipped without one): the probe's line gives the tensors' high-water mark of a model's first
// step at bigger batches (new shapes: cuDNN searches their algorithms, as in a run's first step), in bf16
// and f32: the per-image slope between two batches, and the level.
TEST(MemoryPlan, CudaProbeGivesTheFirstStepsTensorPeak) {
  if (!cuda_available()) GTEST_SKIP() << "needs a GPU";
  const Device gpu = Device::cuda(0);
  for (const Precision precision : {Precision::BF16, Precision::FP32}) {
    manual_seed(3);
    auto model = std::make_shared<ResNet>("resnet18", ResNetOptions{.num_classes = 10});
    model->to(gpu);
    model->train();
    DataInfo info;
    info.height = info.width = 128;
    info.channels = 3;
    info.classes = 10;
    TrainerOptions o = sgd(64);
    o.precision = precision;
    const ActivationCurve c = probe_activations(o, gpu, *model, info, {});
    for (auto& [n, p] : model->named_parameters()) p.set_grad(Tensor::zeros(p.shape(), p.dtype(), gpu));
    auto first_step = [&](int64_t b) {
      const Tensor images = Tensor::normal(Shape{b, 128, 128, 3}, 0.0, 1.0, /*seed=*/7, DType::F32, gpu);
      const Tensor labels = Tensor::zeros(Shape{b}, DType::I64, gpu);
      synchronize(gpu);
      empty_cache(gpu);
      const int64_t before = memory_stats(gpu).allocated_bytes;
      reset_peak_memory(gpu);
      {
        Tensor loss;
        {
          AutocastGuard scope(autocast_type(precision));
          loss = CrossEntropyLoss()((*model)(images), labels);
        }
        loss.backward();
      }
      synchronize(gpu);
      return memory_stats(gpu).peak_allocated_bytes - before;
    };
    const int64_t at32 = first_step(32), at64 = first_step(64);
    const double slope = static_cast<double>(at64 - at32) / 32;
    EXPECT_NEAR(static_cast<double>(c.per_image) / slope, 1.0, 0.10)
        << name_of(precision) << ": probe " << c.per_image << " B an image, first steps " << slope;
    EXPECT_NEAR(static_cast<double>(c.at(64)) / static_cast<double>(at64), 1.0, 0.10)
        << name_of(precision) << ": probe " << c.at(64) << " B at 64 images, first step " << at64;
    model->zero_grad(true);
  }
}

}  // namespace
}  // namespace ringtrain::runtime
