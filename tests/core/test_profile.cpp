// The per-op profiler's recording side (core/profile.h) and the checks the device leaves for the host's
// next read (core/device.h): families, nesting, the cost of being off, and the deferred label check.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/autograd.h"
#include "core/check.h"
#include "core/device.h"
#include "core/ops.h"
#include "core/profile.h"
#include "test_util.h"

namespace ringtrain {
namespace {

// A conv -> batch norm + ReLU -> mean-pool -> linear -> cross-entropy step, forward and backward, on
// tensors made on the device once (a copy from host memory makes the host wait, as a loader's would not).
struct SmallStep {
  Tensor x, w, gamma, beta, rm, rv, fc, labels;
  explicit SmallStep(Device device)
      : x(Tensor::uniform(Shape{4, 8, 8, 3}, -1, 1, 1).to(device)),
        w(Tensor::uniform(Shape{8, 3, 3, 3}, -0.5, 0.5, 2).to(device).set_requires_grad()),
        gamma(Tensor::ones(Shape{8}).to(device).set_requires_grad()),
        beta(Tensor::zeros(Shape{8}).to(device).set_requires_grad()),
        rm(Tensor::zeros(Shape{8}).to(device)),
        rv(Tensor::ones(Shape{8}).to(device)),
        fc(Tensor::uniform(Shape{10, 8}, -0.5, 0.5, 3).to(device).set_requires_grad()),
        labels(Tensor::from_vector({1, 2, 3, 4}, Shape{4}, DType::I64).to(device)) {}
  void operator()() const {
    Tensor y = conv2d(x, w, Tensor(), {.pad_h = 1, .pad_w = 1});
    y = relu(batch_norm(y, gamma, beta, rm, rv, true, 0.1, 1e-5));
    Tensor pooled = mean(y.reshape(Shape{4, 64, 8}), 1);
    Tensor logits = linear(pooled, fc, Tensor());
    cross_entropy(logits, labels).backward();
  }
};

void small_step(Device device) { SmallStep{device}(); }

std::set<std::string> families(const profile::Table& t) {
  std::set<std::string> out;
  for (const auto& f : t.families) out.insert(f.family);
  return out;
}

TEST(Profile, KernelEntriesMapToTheirFamilies) {
  EXPECT_STREQ(profile::family_of_kernel("conv2d_forward"), "conv_fwd");
  EXPECT_STREQ(profile::family_of_kernel("conv2d_backward_data"), "conv_dgrad");
  EXPECT_STREQ(profile::family_of_kernel("conv2d_backward_weights"), "conv_wgrad");
  EXPECT_STREQ(profile::family_of_kernel("batch_norm_relu_backward"), "bn_bwd");
  EXPECT_STREQ(profile::family_of_kernel("batch_norm_update_running"), "bn_fwd");
  EXPECT_STREQ(profile::family_of_kernel("batch_norm_stats"), "bn_fwd");
  EXPECT_STREQ(profile::family_of_kernel("sgd_multi_tensor"), "optimizer");
  EXPECT_STREQ(profile::family_of_kernel("convert"), "cast_copy");
  EXPECT_STREQ(profile::family_of_kernel("max_pool2d_backward"), "pool");
  EXPECT_STREQ(profile::family_of_kernel("cross_entropy_backward"), "loss");
  EXPECT_STREQ(profile::family_of_kernel("binary"), "elementwise");
  EXPECT_STREQ(profile::family_of_kernel("something_new"), "other");
}

TEST(Profile, ASessionTimesEachFamilyPerStep) {
  small_step(Device::cpu());  // warm-up outside the session: not recorded
  profile::Session session(Device::cpu());
  for (int s = 0; s < 3; ++s) {
    session.begin_step();
    small_step(Device::cpu());
    session.end_step();
  }
  const profile::Table t = session.table();
  EXPECT_EQ(t.steps, 3);
  const auto seen = families(t);
  for (const char* f : {"conv_fwd", "conv_wgrad", "bn_fwd", "bn_bwd", "loss", "gemm", "elementwise"})
    EXPECT_TRUE(seen.count(f)) << "no " << f << " row";
  EXPECT_FALSE(seen.count("conv_dgrad")) << "x does not require grad: no data gradient";
  for (const auto& f : t.families) {
    if (f.family == "conv_fwd") {
      EXPECT_DOUBLE_EQ(f.calls, 1.0) << "one convolution per step";
    }
    EXPECT_GE(f.host_ms, 0.0);
    EXPECT_EQ(f.device_ms, 0.0) << "no GPU time on the CPU";
    EXPECT_GE(f.share, 0.0);
  }
  EXPECT_GT(t.step_ms, 0.0);
  EXPECT_LE(t.covered_share, 1.05) << "nested calls must not count twice";
  EXPECT_EQ(t.syncs_per_step, 0.0);
}

TEST(Profile, NothingIsRecordedOutsideAStepOrWithoutASession) {
  small_step(Device::cpu());  // no session: KernelCall does not record
  profile::Session session(Device::cpu());
  small_step(Device::cpu());  // between steps: dropped at begin_step
  session.begin_step();
  session.end_step();
  EXPECT_TRUE(session.table().families.empty());
  EXPECT_TRUE(profile::on()) << "the session is open";
}

TEST(Profile, NestedSpansCountOnce) {
  profile::Session session(Device::cpu());
  session.begin_step();
  {
    profile::Span outer("data", Device::cpu(), "loading");
    small_step(Device::cpu());  // every kernel inside is the outer span's time
  }
  session.end_step();
  const profile::Table t = session.table();
  ASSERT_EQ(t.families.size(), 1u);
  EXPECT_EQ(t.families[0].family, "data");
  EXPECT_DOUBLE_EQ(t.families[0].calls, 1.0);
}

TEST(Profile, OneSessionAtATime) {
  profile::Session a(Device::cpu());
  EXPECT_THROW(profile::Session b(Device::cpu()), Error);
}

TEST(Profile, ClosedSessionTurnsRecordingOff) {
  { profile::Session a(Device::cpu()); }
  EXPECT_FALSE(profile::on());
}

TEST(DeferredChecks, RunInOrderAtTheNextRunAndThrowTheFirstError) {
  run_deferred_checks();
  std::string order;
  defer_device_check({}, [&](const std::vector<Tensor>&) { order += "a"; });
  defer_device_check({}, [&](const std::vector<Tensor>&) { order += "b"; });
  EXPECT_EQ(deferred_checks_pending(), 2u);
  EXPECT_EQ(order, "");
  run_deferred_checks();
  EXPECT_EQ(order, "ab");
  EXPECT_EQ(deferred_checks_pending(), 0u);
  defer_device_check({}, [](const std::vector<Tensor>&) { RT_THROW("bad label found later"); });
  try {
    run_deferred_checks();
    FAIL() << "expected the deferred error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad label found later"), std::string::npos);
  }
  EXPECT_EQ(deferred_checks_pending(), 0u) << "a check runs once";
}

TEST(DeferredChecks, AFullListRunsBeforeTakingMore) {
  run_deferred_checks();
  int ran = 0;
  for (size_t i = 0; i < kMaxDeferredChecks; ++i) defer_device_check({}, [&](const std::vector<Tensor>&) { ++ran; });
  EXPECT_EQ(ran, 0);
  defer_device_check({}, [&](const std::vector<Tensor>&) { ++ran; });
  EXPECT_EQ(ran, static_cast<int>(kMaxDeferredChecks));
  EXPECT_EQ(deferred_checks_pending(), 1u);
  run_deferred_checks();
}

TEST(DeferredChecks, GetTheirEvidenceAndGoToACapturesSinkWhileOneRuns) {
  run_deferred_checks();
  std::vector<double> seen;
  defer_device_check({Tensor::from_vector({3, 4}, Shape{2})}, [&](const std::vector<Tensor>& evidence) {
    ASSERT_EQ(evidence.size(), 1u);
    seen = evidence[0].to_vector();
  });
  // Under a CudaGraph's capture (core/cuda/device.cpp sets the sink) a check belongs to the graph.
  std::vector<detail::DeferredCheck> sink;
  detail::set_capture_sink(&sink);
  defer_device_check({Tensor::zeros(Shape{1})}, [](const std::vector<Tensor>&) { RT_THROW("not yet"); });
  detail::set_capture_sink(nullptr);
  EXPECT_EQ(sink.size(), 1u);
  EXPECT_EQ(deferred_checks_pending(), 1u);
  run_deferred_checks();
  EXPECT_EQ(seen, (std::vector<double>{3, 4}));
}

TEST(DeferredChecks, CpuLabelCheckStillFailsAtTheOp) {
  Tensor logits = Tensor::zeros(Shape{3, 4});
  Tensor labels = Tensor::from_vector({0, 7, 1}, Shape{3}, DType::I64);
  try {
    cross_entropy(logits, labels);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("label 7 at row 1 is outside [0, 4)"), std::string::npos) << m;
    EXPECT_EQ(m.find("next read"), std::string::npos) << "not deferred on the CPU: " << m;
  }
  EXPECT_EQ(deferred_checks_pending(), 0u);
}

TEST(DeferredChecks, GpuLabelCheckWaitsForTheNextReadOfTheLoss) {
  RT_REQUIRE_CUDA();
  run_deferred_checks();
  const Device gpu = Device::cuda(0);
  Tensor logits = Tensor::zeros(Shape{3, 4}).to(gpu);
  Tensor labels = Tensor::from_vector({0, 1, -2}, Shape{3}, DType::I64).to(gpu);
  const int64_t before = cuda_host_syncs();
  Tensor loss = cross_entropy(logits, labels);  // no host wait, no error yet
  EXPECT_EQ(cuda_host_syncs(), before) << "the label check must not wait for the GPU";
  EXPECT_EQ(deferred_checks_pending(), 1u);
  try {
    loss.item();
    FAIL() << "expected the label error at the read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label -2 at row 2 is outside [0, 4)"), std::string::npos) << e.what();
  }
  // Valid labels: nothing to report.
  Tensor good = Tensor::from_vector({0, 1, 3}, Shape{3}, DType::I64).to(gpu);
  EXPECT_NO_THROW(cross_entropy(logits, good).item());
}

TEST(HostSyncs, GpuStepWithoutReadsWaitsForNothing) {
  RT_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  const SmallStep step(gpu);
  step();  // warm-up: cuDNN's algorithm search may wait
  synchronize(gpu);
  const int64_t before = cuda_host_syncs();
  for (int s = 0; s < 3; ++s) step();
  EXPECT_EQ(cuda_host_syncs() - before, 0) << "forward + backward on the GPU waited on the host";
  run_deferred_checks();
}

TEST(HostSyncs, GpuProfileCountsDeviceTime) {
  RT_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  const SmallStep step(gpu);
  step();
  profile::Session session(gpu);
  for (int s = 0; s < 2; ++s) {
    session.begin_step();
    step();
    session.end_step();
  }
  const profile::Table t = session.table();
  double device_ms = 0;
  for (const auto& f : t.families) device_ms += f.device_ms;
  EXPECT_GT(device_ms, 0.0);
  EXPECT_EQ(t.syncs_per_step, 0.0) << "the profiler's own waits are not the step's";
  run_deferred_checks();
}

TEST(HostSyncs, CpuBuildCountsNone) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: covered by the GPU tests above";
  small_step(Device::cpu());
  EXPECT_EQ(cuda_host_syncs(), 0);
}

}  // namespace
}  // namespace ringtrain
