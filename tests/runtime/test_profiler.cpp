// --profile's report (runtime/telemetry/profiler.h) and the loss log that keeps a GPU step free of host waits
// (runtime/step/loss_log.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/device.h"
#include "core/profile.h"
#include "layers/basic.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/pooling.h"
#include "runtime/step/loss_log.h"
#include "runtime/telemetry/profiler.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {

using Taken = std::vector<std::pair<int64_t, double>>;  // (micro, value)

TEST(LossLog, WithoutDeferralEveryLossIsReadAtOnce) {
  LossLog log(false);
  Taken taken;
  auto take = [&](const LossLog::Origin& o, double v) { taken.emplace_back(o.micro, v); };
  log.add(Tensor::from_vector({2.5}, Shape{1}), {0, 0, 0}, take);
  EXPECT_EQ(taken, (Taken{{0, 2.5}}));
  EXPECT_EQ(log.pending(), 0);
}

TEST(LossLog, DeferredLossesAreReadInOrderAtTheFlush) {
  LossLog log(true);
  Taken taken;
  auto take = [&](const LossLog::Origin& o, double v) { taken.emplace_back(o.micro, v); };
  log.add(Tensor::from_vector({1.0}, Shape{1}), {0, 0, 0}, take);
  log.add(Tensor::from_vector({2.0}, Shape{1}, DType::BF16), {0, 1, 1}, take);
  log.add(Tensor::from_vector({3.0}, Shape{1}, DType::F64), {0, 2, 2}, take);
  EXPECT_TRUE(taken.empty()) << "nothing is read before the flush";
  EXPECT_EQ(log.pending(), 3);
  log.flush(take);
  EXPECT_EQ(taken, (Taken{{0, 1.0}, {1, 2.0}, {2, 3.0}}));
  EXPECT_EQ(log.pending(), 0);
  log.flush(take);
  EXPECT_EQ(taken.size(), 3u) << "a second flush reads nothing again";
}

TEST(LossLog, AFullBufferIsReadBeforeTheNextLoss) {
  LossLog log(true, 2);
  Taken taken;
  auto take = [&](const LossLog::Origin& o, double v) { taken.emplace_back(o.micro, v); };
  for (int i = 0; i < 5; ++i) log.add(Tensor::from_vector({double(i)}, Shape{1}), {0, i, i}, take);
  EXPECT_EQ(taken, (Taken{{0, 0.0}, {1, 1.0}, {2, 2.0}, {3, 3.0}}));
  EXPECT_EQ(log.pending(), 1);
}

TEST(LossLog, ANonFiniteLossReachesTheTakerWithItsOrigin) {
  LossLog log(true);
  auto take = [](const LossLog::Origin& o, double v) {
    if (!std::isfinite(v)) RT_THROW("non-finite loss at step ", o.step, " micro-batch ", o.micro);
  };
  log.add(Tensor::from_vector({1.0}, Shape{1}), {0, 4, 8}, take);
  log.add(Tensor::from_vector({std::numeric_limits<double>::quiet_NaN()}, Shape{1}), {0, 5, 9}, take);
  try {
    log.flush(take);
    FAIL() << "expected the taker's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 5 micro-batch 9"), std::string::npos) << e.what();
  }
  EXPECT_EQ(log.pending(), 0);
}

TEST(LossLog, RefusesWhatIsNotOneLoss) {
  LossLog log(true);
  EXPECT_THROW(log.add(Tensor::zeros(Shape{2}), {}, [](const LossLog::Origin&, double) {}), Error);
  EXPECT_THROW(LossLog(true, 0), Error);
}

TEST(LossLog, GpuLossesWaitForNothingUntilTheFlush) {
  RT_REQUIRE_CUDA();
  LossLog log(true);
  Taken taken;
  auto take = [&](const LossLog::Origin& o, double v) { taken.emplace_back(o.micro, v); };
  Tensor a = Tensor::from_vector({1.5}, Shape{1}).to(Device::cuda(0));
  Tensor b = Tensor::from_vector({2.5}, Shape{}, DType::BF16).to(Device::cuda(0));
  synchronize(Device::cuda(0));
  run_deferred_checks();  // earlier tests' (each reads its own flag): not this log's
  const int64_t before = cuda_host_syncs();
  log.add(a, {0, 0, 0}, take);
  log.add(b, {0, 1, 1}, take);
  EXPECT_EQ(cuda_host_syncs(), before);
  log.flush(take);
  EXPECT_EQ(cuda_host_syncs(), before + 1) << "one read for all pending losses";
  EXPECT_EQ(taken, (Taken{{0, 1.5}, {1, 2.5}}));
}

profile::Table example_table() {
  profile::Table t;
  t.steps = 3;
  t.step_ms = 10;
  t.syncs_per_step = 0;
  t.families = {{"conv_fwd", 2, 0, 6, 0.6}, {"bn_fwd", 4, 0, 3, 0.3}};
  t.covered_share = 0.9;
  return t;
}

TEST(ProfileReport, RecordCarriesEveryFamily) {
  const auto r = profile_record(example_table());
  EXPECT_EQ(r["type"], "profile");
  EXPECT_EQ(r["step_ms"], 10.0);
  EXPECT_EQ(r["syncs_per_step"], 0.0);
  ASSERT_EQ(r["families"].size(), 2u);
  EXPECT_EQ(r["families"][0]["family"], "conv_fwd");
  EXPECT_EQ(r["families"][0]["calls"], 2.0);
  EXPECT_EQ(r["families"][0]["host_ms"], 6.0);
  EXPECT_EQ(r["families"][1]["share"], 0.3);
}

TEST(ProfileReport, TableNamesFamiliesAndTheCoveredShare) {
  const std::string text = format_profile(example_table());
  EXPECT_NE(text.find("conv_fwd"), std::string::npos) << text;
  EXPECT_NE(text.find("60.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("cover 90.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("host clocks"), std::string::npos) << text;
}

TEST(StepProfiler, OpensAfterTheWarmUpAndClosesAfterItsSteps) {
  StepProfiler p(Device::cpu(), 2, /*first_step=*/10, /*warmup=*/3);
  for (int64_t step = 10; step < 13; ++step) {
    p.begin_step(step);
    EXPECT_FALSE(p.in_window()) << "step " << step << " is a warm-up step";
    EXPECT_FALSE(p.end_step(step));
  }
  p.begin_step(13);
  EXPECT_TRUE(p.in_window());
  EXPECT_FALSE(p.end_step(13));
  p.begin_step(14);
  EXPECT_TRUE(p.end_step(14));
  ASSERT_TRUE(p.table().has_value());
  EXPECT_EQ(p.table()->steps, 2);
  p.begin_step(15);
  EXPECT_FALSE(p.in_window()) << "one window per run";
  EXPECT_FALSE(p.end_step(15));
}

// --profile-layers: each op under the module whose call ran it, the backward under the module that recorded
// it; the loss outside any module is "(none)". Layer names are the modules' dotted paths.
TEST(ProfileLayers, OpsAndTheirBackwardCountUnderTheirModule) {
  auto block = std::make_shared<Sequential>();
  block->add(std::make_shared<Conv2d>(3, 4, Conv2dOptions{.padding = 1}))
      .add(std::make_shared<BatchNorm2d>(4))
      .add(std::make_shared<ReLU>());
  Sequential model;
  model.add(block).add(std::make_shared<GlobalAvgPool>()).add(std::make_shared<Linear>(4, 3));
  Tensor x = Tensor::uniform(Shape{2, 6, 6, 3}, -1, 1, 5);
  Tensor y = Tensor::from_vector({0, 2}, Shape{2}, DType::I64);
  CrossEntropyLoss loss_fn;
  profile::Session session(Device::cpu(), /*per_layer=*/true);
  session.begin_step();
  loss_fn(model(x), y).backward();
  session.end_step();
  const profile::Table t = session.table();
  std::set<std::pair<std::string, std::string>> rows;
  for (const auto& l : t.layers) rows.insert({l.layer, l.figures.family});
  EXPECT_TRUE(rows.count({"0.0", "conv_fwd"})) << "the convolution under its path";
  EXPECT_TRUE(rows.count({"0.0", "conv_wgrad"})) << "its backward under the module that recorded it";
  EXPECT_TRUE(rows.count({"0.1", "bn_fwd"}));
  EXPECT_TRUE(rows.count({"0.1", "bn_bwd"}));
  EXPECT_TRUE(rows.count({"2", "gemm"}));
  EXPECT_TRUE(rows.count({"(none)", "loss"})) << "the loss runs outside the model";
  double layer_ms = 0, family_ms = 0;
  for (const auto& l : t.layers) layer_ms += l.figures.host_ms;
  for (const auto& f : t.families) family_ms += f.host_ms;
  EXPECT_NEAR(layer_ms, family_ms, 1e-9) << "the layer rows split the families' time, nothing more";
  const auto record = profile_record(t);
  EXPECT_EQ(record["layers"].size(), t.layers.size());
  EXPECT_NE(format_profile(t).find("0.0"), std::string::npos);
}

TEST(ProfileLayers, OffByDefault) {
  Sequential model;
  model.add(std::make_shared<Linear>(4, 3));
  profile::Session session(Device::cpu());
  session.begin_step();
  model(Tensor::zeros(Shape{2, 4}));
  session.end_step();
  EXPECT_TRUE(session.table().layers.empty());
  EXPECT_EQ(profile::current_layer(), nullptr);
}

TEST(StepProfiler, OffDoesNothing) {
  StepProfiler p(Device::cpu(), 0, 0);
  p.begin_step(5);
  EXPECT_FALSE(p.in_window());
  EXPECT_FALSE(p.end_step(5));
  EXPECT_FALSE(p.table().has_value());
}

}  // namespace
}  // namespace ringtrain::runtime
