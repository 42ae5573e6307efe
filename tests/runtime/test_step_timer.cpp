// Tests for runtime/telemetry/step_timer.h and runtime/telemetry/run_log.h: the phase sums, the breakdown that leaves
// out the run's first step, the median, per-bucket means, and the JSONL records' documented fields.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/telemetry/run_log.h"
#include "runtime/telemetry/step_timer.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {
using json = nlohmann::json;

TEST(StepTimer, IntervalBreakdownAndMedian) {
  StepTimer timer(2);
  const auto t0 = StepTimer::TimePoint{};
  auto bucket = [&](int i, double ready, double run) {
    comm::GradSync::BucketTiming b;
    b.bucket = i;
    b.launched =
        t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(ready));
    b.begin = b.launched;
    b.end =
        b.begin + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(run));
    return b;
  };
  for (int s = 0; s < 3; ++s) {
    timer.current().forward += 1.0 + s;  // micro-batches accumulate
    timer.current().forward += 1.0;
    timer.current().optimizer = 0.5;
    timer.end_step(10.0 * (s + 1), /*counts_in_breakdown=*/s > 0, t0,
                   {bucket(0, 0.1 * (s + 1), 0.2), bucket(1, 0.3, 0.4)});
  }
  EXPECT_EQ(timer.interval_steps(), 3);
  EXPECT_DOUBLE_EQ(timer.interval_mean().forward, (2.0 + 3.0 + 4.0) / 3);
  EXPECT_EQ(timer.breakdown_steps(), 2);
  EXPECT_DOUBLE_EQ(timer.breakdown_mean().forward, 3.5);  // steps 2 and 3 only
  EXPECT_DOUBLE_EQ(timer.breakdown_mean().optimizer, 0.5);
  EXPECT_DOUBLE_EQ(timer.median_step_s(), 20.0);
  EXPECT_NEAR(timer.bucket_ready_s(0), 0.25, 1e-9);
  EXPECT_NEAR(timer.bucket_allreduce_s(1), 0.4, 1e-9);
  EXPECT_EQ(timer.bucket_ready_s(5), 0.0);
  timer.reset_interval();
  EXPECT_EQ(timer.interval_steps(), 0);
  EXPECT_EQ(timer.current().forward, 0.0) << "end_step starts a fresh step";
  double a[PhaseTimes::kCount];
  PhaseTimes{1, 2, 3, 4, 5}.to_array(a);
  EXPECT_EQ(PhaseTimes::from_array(a).to_json(),
            (json{{"data_wait", 1}, {"forward", 2}, {"backward", 3}, {"exposed_comm", 4}, {"optimizer", 5}}));
}

TEST(RunLog, RecordsHaveTheDocumentedFields) {
  comm::BucketInfo b;
  b.numel = 10;
  b.bytes = 40;
  b.parameters = {"fc.weight", "fc.bias"};
  const json plan = plan_record({.world_size = 2,
                                 .nodes = 1,
                                 .threads = 1,
                                 .arch = "net",
                                 .backend = "ring",
                                 .device = "cpu",
                                 .batch_size = 8,
                                 .accum_steps = 2,
                                 .global_batch = 32,
                                 .buckets = {b, b},
                                 .zero = 1,
                                 .optimizer_state_bytes = {40, 40}});
  for (const char* key : {"type", "world_size", "nodes", "arch", "batch_size", "accum_steps", "global_batch", "backend",
                          "device", "threads", "params", "buckets", "zero", "optimizer_state_bytes"})
    EXPECT_TRUE(plan.contains(key)) << key;
  EXPECT_EQ(plan["optimizer_state_bytes"], json::array({40, 40}));
  EXPECT_EQ(plan["params"], 20);
  EXPECT_EQ(plan["buckets"][0]["parameters"], 2);
  const json train =
      train_record({.step = 3, .epoch = 0, .lr = 0.1, .loss = 1.5, .img_per_s = 9, .time = {}, .grad_norm = {}});
  EXPECT_EQ(train["type"], "train");
  EXPECT_EQ(train["time"].size(), 5u);
  EXPECT_FALSE(train.contains("grad_norm")) << "only with clipping";
  EXPECT_EQ(
      train_record(
          {.step = 3, .epoch = 0, .lr = 0.1, .loss = 1.5, .img_per_s = 9, .time = {}, .grad_norm = 2.5})["grad_norm"],
      2.5);
  EXPECT_EQ(cuda_graph_record(2, ""), (json{{"type", "cuda_graph"}, {"step", 2}, {"state", "captured"}}));
  EXPECT_EQ(cuda_graph_record(3, "why"),
            (json{{"type", "cuda_graph"}, {"step", 3}, {"state", "off"}, {"reason", "why"}}));
  SummaryRecord s;
  s.breakdown_by_rank = {PhaseTimes{}, PhaseTimes{}};
  s.peak_mem_bytes_by_rank = {1e8, 2e8};
  s.eval = EvalResult{0.5, 0.9, 1.0, 10};
  const json summary = summary_record(s);
  for (const char* key : {"train_loss", "img_per_s", "median_step_s", "peak_mem_bytes", "peak_mem_bytes_by_rank",
                          "world_size", "steps", "elapsed_s", "breakdown_s", "breakdown_by_rank_s", "buckets",
                          "breakdown_steps", "precision", "device", "step_clock", "test_top1", "test_top5"})
    EXPECT_TRUE(summary.contains(key)) << key;
  EXPECT_EQ(summary["step_clock"], "host") << "the CPU's steps end on the host";
  EXPECT_FALSE(summary.contains("loss_scale")) << "only with f16 loss scaling";
  EXPECT_FALSE(summary.contains("peak_gpu_mem_bytes")) << "only on a GPU";
  EXPECT_EQ(summary["breakdown_by_rank_s"].size(), 2u);
}

TEST(RunLog, AppendsOneLinePerRecordAndNamesAnUnwritablePath) {
  const auto path =
      std::filesystem::path(::testing::TempDir()) / ("rt_runlog_" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  {
    RunLog log(path.string(), true);
    log.write({{"type", "a"}});
    log.write({{"type", "b"}});
    RunLog off(path.string(), false);  // not the writer: writes nothing
    off.write({{"type", "c"}});
  }
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  EXPECT_EQ(lines, (std::vector<std::string>{R"({"type":"a"})", R"({"type":"b"})"}));
  std::filesystem::remove(path);
  const std::string e = testing::error_of([] { RunLog("/nonexistent/dir/x.jsonl", true); });
  EXPECT_NE(e.find("--log-jsonl: cannot write '/nonexistent/dir/x.jsonl'"), std::string::npos) << e;
}

}  // namespace
}  // namespace ringtrain::runtime
