// Runs under mpirun with 1, 2 and 3 ranks: evaluate() scores every test image exactly once across ranks
// (the same figures as one process scoring the whole split), the step check-in names the rank that is out
// of step, and the Trainer trains a model that is not a ResNet — with a step function of its own — and
// resumes it bitwise exactly from a checkpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/host_collectives.h"
#include "comm/world.h"
#include "core/ops.h"
#include "io/checkpoint.h"
#include "layers/basic.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/pooling.h"
#include "mpi_datasets.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/cluster/check_in.h"
#include "runtime/cluster/watchdog.h"
#include "runtime/config/data_source.h"
#include "runtime/loop/trainer.h"
#include "runtime/step/evaluate.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {
namespace fs = std::filesystem;

comm::World& world() { return comm::World::init(); }

fs::path make_dataset(const std::string& what, int64_t train_count, int64_t test_count) {
  return ringtrain::testing::make_dataset("rt_runtime", what, train_count, test_count);
}

// Logits = per-channel means of the image: classes == channels, each image scored on its own (no GEMM,
// whose rounding could depend on the batch), so 1 rank and N ranks give the same per-image answers.
class ChannelMeans : public Module {
 public:
  Tensor forward(const Tensor& x) override { return pool_(x); }
  std::string type_name() const override { return "ChannelMeans"; }

 private:
  GlobalAvgPool pool_;
};

TEST(Evaluate, CountsEveryTestImageOnceAcrossRanks) {
  const fs::path dir = make_dataset("eval", 8, 37);  // 37: never divisible by 2 or 3 ranks
  auto data = open_shards(dir, {});
  ChannelMeans model;
  // The reference: this process alone scores the whole split, batch by batch.
  data::Loader* loader = data->test_loader();
  ASSERT_NE(loader, nullptr);
  loader->start(data::eval_batches(37, 0, 1, 5), 0);
  double correct = 0, seen = 0;
  while (auto b = loader->next()) {
    Tensor predicted = argmax(model(b->images.slice(0, b->valid)), 1);
    correct += sum(eq(predicted, b->labels.slice(0, b->valid)).to(DType::F64)).item();
    seen += static_cast<double>(b->valid);
  }
  ASSERT_EQ(seen, 37);
  int batches = 0;
  const EvalResult r = evaluate(model, *loader, 37, world(), {.batch = 4, .on_batch = [&] { ++batches; }});
  EXPECT_EQ(r.count, 37);
  EXPECT_DOUBLE_EQ(r.top1, correct / 37);
  EXPECT_EQ(r.top5, 1.0) << "3 classes: the true class is always among the top 5";
  EXPECT_GT(r.loss, 0);
  EXPECT_GT(batches, 0);
  EXPECT_TRUE(model.is_training()) << "evaluate puts the model back in training mode";
  data->stop();
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

// One image of (label, predicted class) pixels as logits (N=1, H, W, C): the predicted class scores 4, the others 0.
Tensor one_hot_logits(const std::vector<int64_t>& predicted, int64_t h, int64_t w, int64_t classes) {
  std::vector<double> v(static_cast<size_t>(h * w * classes), 0.0);
  for (size_t p = 0; p < predicted.size(); ++p) v[p * static_cast<size_t>(classes) + predicted[p]] = 4;
  return Tensor::from_vector(v, {1, h, w, classes});
}

// Per-pixel scoring: the ignored pixels count for nothing, the mean IoU is over the classes labelled or predicted,
// and N ranks' sums give what one process scoring every rank's pixels would.
TEST(Evaluate, SegmentationScoresPixelsAndTheMeanIoUAcrossRanks) {
  const CrossEntropyLoss loss_fn({.ignore_index = 255});
  {
    // Every rank the same image: labels [[0 0 1] [2 255 1]], predictions [[0 1 1] [2 0 0]]. Per class
    // (intersection / union): 0: 1/3, 1: 1/3, 2: 1/1; class 3 neither labelled nor predicted.
    EvalSums sums(4);
    sums.score(one_hot_logits({0, 1, 1, 2, 0, 0}, 2, 3, 4),
               Tensor::from_vector({0, 0, 1, 2, 255, 1}, {1, 2, 3}, DType::I64), loss_fn);
    const EvalResult r = sums.total(world().comm());
    EXPECT_TRUE(r.segmentation);
    EXPECT_EQ(r.count, 5 * world().size()) << "the ignored pixel is not counted";
    EXPECT_DOUBLE_EQ(r.top1, 3.0 / 5);
    EXPECT_NEAR(r.miou, 5.0 / 9, 1e-12);
    EXPECT_GT(r.loss, 0);
  }
  // Each rank its own image; the reference counts every rank's pixels here.
  const int64_t classes = 3, pixels = 12;
  auto image_of = [&](int rank, std::vector<int64_t>* labels, std::vector<int64_t>* predicted) {
    for (int64_t p = 0; p < pixels; ++p) {
      labels->push_back((p * (rank + 1) + rank) % 4 == 3 ? 255 : (p * (rank + 1) + rank) % 4);
      predicted->push_back((p + 2 * rank) % classes);
    }
  };
  std::vector<double> intersection(classes, 0), union_(classes, 0);
  double right = 0, counted = 0;
  for (int rank = 0; rank < world().size(); ++rank) {
    std::vector<int64_t> labels, predicted;
    image_of(rank, &labels, &predicted);
    for (size_t p = 0; p < labels.size(); ++p) {
      if (labels[p] == 255) continue;
      counted += 1;
      right += labels[p] == predicted[p];
      intersection[static_cast<size_t>(labels[p])] += labels[p] == predicted[p];
      union_[static_cast<size_t>(labels[p])] += 1;
      if (labels[p] != predicted[p]) union_[static_cast<size_t>(predicted[p])] += 1;
    }
  }
  double miou = 0;
  for (int64_t c = 0; c < classes; ++c) miou += intersection[static_cast<size_t>(c)] / union_[static_cast<size_t>(c)];
  miou /= classes;
  std::vector<int64_t> labels, predicted;
  image_of(world().rank(), &labels, &predicted);
  EvalSums sums(classes);
  sums.score(one_hot_logits(predicted, 3, 4, classes),
             Tensor::from_vector(std::vector<double>(labels.begin(), labels.end()), {1, 3, 4}, DType::I64), loss_fn);
  const EvalResult r = sums.total(world().comm());
  EXPECT_EQ(r.count, static_cast<int64_t>(counted));
  EXPECT_DOUBLE_EQ(r.top1, right / counted);
  EXPECT_NEAR(r.miou, miou, 1e-12);
  // Labels beyond the logits' classes, and per-pixel labels without the mean IoU's classes, are refused.
  EvalSums plain;
  EXPECT_NE(testing::error_of([&] {
              plain.score(one_hot_logits(predicted, 3, 4, classes),
                          Tensor::from_vector(std::vector<double>(12, 0.0), {1, 3, 4}, DType::I64), loss_fn);
            }).find("need the classes of the mean IoU"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              sums.score(one_hot_logits(predicted, 3, 4, classes),
                         Tensor::from_vector(std::vector<double>(12, 3.0), {1, 3, 4}, DType::I64), loss_fn);
            }).find("label 3 is outside [0, 3)"),
            std::string::npos);
}

TEST(CheckIn, ARankOutOfStepIsNamedOnEveryRank) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  EXPECT_NO_THROW(check_in_step(world(), 5, 1234));
  const int late = world().size() - 1;
  const std::string e = testing::error_of([&] { check_in_step(world(), world().rank() == late ? 6 : 5, 1234); });
  EXPECT_NE(e.find("ranks are out of step: rank 0 is at step 5, rank " + std::to_string(late) + " at step 6"),
            std::string::npos)
      << e;
  const std::string p = testing::error_of([&] { check_in_step(world(), 5, world().rank() == late ? 99 : 1234); });
  EXPECT_NE(p.find("with a different bucket plan"), std::string::npos) << p;
}

// The check-in carries one rank's request (rank 0's time-based checkpoint) to every rank.
TEST(CheckIn, CarriesTheLargestRequestToEveryRank) {
  EXPECT_EQ(check_in_step(world(), 5, 1234), 0);
  EXPECT_EQ(check_in_step(world(), 5, 1234, world().rank() == 0 ? 1 : 0), 1);
  EXPECT_EQ(check_in_step(world(), 5, 1234, world().rank() == world().size() - 1 ? 1 : 0), 1);
}

// A rank waiting past the timeout asks the others (their watchdog threads answer, even from a rank busy in
// compute) and names the one that has not arrived, with its phase and step.
TEST(WatchdogAcrossRanks, AWaitingRankNamesTheRankThatHasNotArrived) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const int late = world().size() - 1;
  std::mutex mutex;
  std::vector<std::string> got;
  {
    Watchdog dog(world(), 0.4, [&](const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      got.push_back(m);
    });
    dog.phase(world().rank() == late ? "forward" : "step check-in (waiting for other ranks)", 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    std::lock_guard<std::mutex> lock(mutex);
    ASSERT_EQ(got.size(), 1u);
    if (world().rank() == late) {
      EXPECT_NE(got[0].find("step 5 stuck in forward"), std::string::npos) << got[0];
      EXPECT_NE(got[0].find("this rank is the one behind"), std::string::npos) << got[0];
    } else {
      const std::string expected = detail::str_cat("rank ", late, " on host ", world().hosts()[late],
                                                   " has not arrived at step 5: it is in forward of step 5 for ");
      EXPECT_NE(got[0].find(expected), std::string::npos) << got[0];
      for (int r = 0; r < late; ++r)  // the other waiting ranks are not blamed
        EXPECT_EQ(got[0].find(detail::str_cat("rank ", r, " on host")), std::string::npos) << got[0];
    }
  }
  comm::barrier(world().comm());
}

// A small CNN that is not a ResNet: conv-bn-relu, pool, linear.
std::shared_ptr<Sequential> small_net(int64_t channels, int64_t classes) {
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Conv2d>(channels, 8, Conv2dOptions{.padding = 1}))
      .add(std::make_shared<BatchNorm2d>(8))
      .add(std::make_shared<ReLU>())
      .add(std::make_shared<GlobalAvgPool>())
      .add(std::make_shared<Linear>(8, classes));
  return net;
}

TrainerOptions small_run(const fs::path& ckpt) {
  TrainerOptions o;
  o.program = "test_runtime";
  o.model_name = "small-cnn";
  o.batch = 12 / world().size();  // global batch 12 on 1, 2, 3 (and 4) ranks
  o.steps = 6;
  o.lr = 0.05;
  o.threads = 1;
  o.log_every = 100;
  o.checkpoint_dir = ckpt.string();
  o.checkpoint_every = 3;
  o.timeout = 120;
  return o;
}

std::vector<std::pair<std::string, std::vector<uint8_t>>> bytes_of(const fs::path& file) {
  const Checkpoint c = load_checkpoint(file);
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  for (const auto* part : {&c.model, &c.optimizer})
    for (const auto& [name, t] : *part) {
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      out.emplace_back(name, std::vector<uint8_t>(p, p + t.nbytes()));
    }
  return out;
}

// An evaluation whose loss is not finite is a failure naming the step, never an accuracy (it was reported as
// "test top-1 0.00% ... loss -nan", exit 0): a BatchNorm whose running variance is negative normalizes by the
// square root of a negative number in eval mode. Every rank stops (the figures are all-reduced).
TEST(Trainer, ANonFiniteEvaluationFailsInsteadOfReportingAnAccuracy) {
  const fs::path dir = make_dataset("nan_eval", 96, 10);
  TrainerOptions o = small_run(dir / "run");
  o.steps = 2;
  Trainer trainer(world(), o);
  auto data = open_shards(dir, {.device = trainer.device()});
  // A ReLU after the BatchNorm, as in any CNN: it keeps the NaN (as PyTorch's), so the check sees it.
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Conv2d>(data->info().channels, 8, Conv2dOptions{.padding = 1}))
      .add(std::make_shared<BatchNorm2d>(8))
      .add(std::make_shared<ReLU>())
      .add(std::make_shared<GlobalAvgPool>())
      .add(std::make_shared<Linear>(8, data->info().classes));
  int negated = 0;
  for (auto& [name, t] : net->named_buffers())
    if (name.ends_with("running_var")) t.fill_(-1e6), ++negated;  // two steps of momentum 0.1 keep it negative
  ASSERT_EQ(negated, 1);
  const std::string e = testing::error_of([&] { trainer.fit(*net, *data); });
  EXPECT_NE(e.find("the evaluation after step 2 gave a test loss of NaN over 10 images: the model's outputs are not "
                   "finite"),
            std::string::npos)
      << e;
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

TEST(Trainer, ResumesACustomModelBitwiseExactly) {
  const fs::path dir = make_dataset("trainer", 96, 10);
  const fs::path a = dir / "a", b = dir / "b";
  int calls = 0;
  // An unusual forward through one callback: the loss plus a small penalty on the logits.
  const StepFn step = [&](Module& m, const data::Batch& batch) {
    ++calls;
    Tensor logits = m(batch.images);
    return add(CrossEntropyLoss()(logits, batch.labels), mul(mean(mul(logits, logits)), 1e-3));
  };
  TrainResult full;
  {
    Trainer trainer(world(), small_run(a));
    auto data = open_shards(dir, {.train_transform = {.pad_crop = 1, .hflip = true}, .device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    full = trainer.fit(*net, *data, step);
  }
  EXPECT_EQ(full.steps, 6);
  EXPECT_EQ(calls, 6 + 2);  // and the memory plan's probe (runtime/memory/memory_plan.h) twice
  ASSERT_TRUE(full.eval);
  EXPECT_EQ(full.eval->count, 10);
  TrainResult resumed;
  {
    TrainerOptions o = small_run(b);
    o.resume = (a / "ckpt-step00000003.h5").string();
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.train_transform = {.pad_crop = 1, .hflip = true}, .device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    resumed = trainer.fit(*net, *data, step);
  }
  EXPECT_EQ(resumed.resumed_from, (a / "ckpt-step00000003.h5").string());
  EXPECT_EQ(resumed.steps, 6);
  EXPECT_EQ(resumed.steps_run, 3);
  EXPECT_EQ(calls, 8 + 3 + 2);
  const auto x = bytes_of(a / "ckpt-step00000006.h5"), y = bytes_of(b / "ckpt-step00000006.h5");
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].first, y[i].first);
    EXPECT_TRUE(x[i].second == y[i].second) << x[i].first << " differs after the resume";
  }
  EXPECT_EQ(resumed.train_loss, full.train_loss);
  // What the checkpoint was trained as must not change: another optimizer or other data is refused.
  {
    TrainerOptions o = small_run(b);
    o.resume = (a / "ckpt-step00000003.h5").string();
    o.optimizer = OptimizerKind::AdamW;
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    const std::string e = testing::error_of([&] { trainer.fit(*net, *data, step); });
    EXPECT_NE(e.find("the checkpoint was written with --optimizer \"sgd\" but this run has \"adamw\""),
              std::string::npos)
        << e;
  }
  // Another run length is allowed but said (the cosine schedule continues from this run's shape).
  {
    TrainerOptions o = small_run(dir / "c");
    o.resume = (a / "ckpt-step00000003.h5").string();
    o.steps = 8;
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    ::testing::internal::CaptureStderr();
    const TrainResult longer = trainer.fit(*net, *data, step);
    const std::string warned = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(longer.steps, 8);
    if (world().is_root()) {
      EXPECT_NE(warned.find("with other flags than it was written with (--steps 6 -> 8)"), std::string::npos) << warned;
    }
  }
  // --resume auto picks the newest (step 6) and, the run being complete, trains nothing more.
  {
    TrainerOptions o = small_run(a);
    o.resume = "auto";
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    const TrainResult again = trainer.fit(*net, *data, step);
    EXPECT_EQ(again.resumed_from, (a / "ckpt-step00000006.h5").string());
    EXPECT_EQ(again.steps_run, 0);
  }
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

// --checkpoint-every-min: rank 0's clock decides and every rank takes part in the save. A cadence far
// below one step's time writes one after every step; the steps/epoch cadence is off (epoch end only).
TEST(Trainer, CheckpointsByTimeOnEveryRanksAgreement) {
  const fs::path dir = make_dataset("by-time", 96, 10);
  TrainerOptions o = small_run(dir / "t");
  o.checkpoint_every = 0;
  o.checkpoint_every_min = 1e-9;
  {
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    EXPECT_EQ(trainer.fit(*net, *data).steps, 6);
  }
  if (world().is_root()) {
    const auto written = CheckpointDir(dir / "t").list();
    ASSERT_EQ(written.size(), 6u);
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(written[static_cast<size_t>(i)].first, i + 1);
  }
  // An hour's cadence writes only the final one in a run of seconds.
  o = small_run(dir / "h");
  o.checkpoint_every = 0;
  o.checkpoint_every_min = 60;
  {
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    trainer.fit(*net, *data);
  }
  if (world().is_root()) {
    EXPECT_EQ(CheckpointDir(dir / "h").list().size(), 1u);
  }
  o.checkpoint_every_min = std::nan("");
  EXPECT_NE(testing::error_of([&] { Trainer(world(), o); }).find("--checkpoint-every-min must be 0 (off) or more"),
            std::string::npos);
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

// --tf32: the run computes under the options' choice (whatever the process had before), records it in the
// plan record and the checkpoints, and a resume under the other choice is said naming the flag.
TEST(Trainer, RunsUnderItsTf32ChoiceRecordsItAndSaysAChangeOnResume) {
  const fs::path dir = make_dataset("tf32", 48, 10);
  TrainerOptions o = small_run(dir / "a");
  o.steps = 2;
  o.tf32 = false;
  o.log_jsonl = (dir / "run.jsonl").string();
  set_allow_tf32(true);
  {
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    EXPECT_EQ(trainer.fit(*net, *data).steps, 2);
  }
  EXPECT_FALSE(allow_tf32()) << "--tf32 off did not reach the convolutions and GEMMs";
  const fs::path written = dir / "a" / "ckpt-step00000002.h5";
  if (world().is_root()) {
    std::ifstream log(dir / "run.jsonl");
    std::string first;
    ASSERT_TRUE(std::getline(log, first));
    const nlohmann::json plan = nlohmann::json::parse(first);
    EXPECT_EQ(plan["type"], "plan");
    EXPECT_EQ(plan["tf32"], "off") << first;
    EXPECT_EQ(CheckpointDir::load(written).state.config["tf32"], "off");
  }
  o = small_run(dir / "b");
  o.steps = 2;
  o.resume = written.string();  // TF32 on (the default) now
  {
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    ::testing::internal::CaptureStderr();
    trainer.fit(*net, *data);
    const std::string warned = ::testing::internal::GetCapturedStderr();
    if (world().is_root()) {
      EXPECT_NE(warned.find("with other flags than it was written with (--tf32 off -> on)"), std::string::npos)
          << warned;
    }
  }
  EXPECT_TRUE(allow_tf32());
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

// --cuda-graph: on one GPU the steps replayed from the graph train exactly as the same steps run op by op
// (SGD and AdamW, two micro-batches a step, BatchNorm's running statistics, a cosine rate that changes every
// step, an epoch's end with its evaluation between replays), and the capture is recorded. Without a GPU the
// same run goes through an emulated graph (RINGTRAIN_CUDA_GRAPH_EMULATE: each replay runs the kept work
// again), which checks what drives the graph (the slots, the staged rate, the losses, the fall-backs) on the
// CPU. Without a GPU and emulation, or with several ranks, the flag is refused, naming why.
TEST(Trainer, CudaGraphStepsTrainLikeStepsRunOpByOp) {
  const fs::path dir = make_dataset("graph", 96, 10);
  struct Emulation {  // on the CPU only, and only for this test
    bool on = !cuda_available();
    Emulation() {
      if (on) setenv("RINGTRAIN_CUDA_GRAPH_EMULATE", "1", 1);
    }
    ~Emulation() {
      if (on) unsetenv("RINGTRAIN_CUDA_GRAPH_EMULATE");
    }
  };
  if (world().size() > 1) {
    TrainerOptions o = small_run(dir / "refused");
    o.cuda_graph = true;
    std::string e = testing::error_of([&] { Trainer trainer(world(), o); });
    EXPECT_NE(e.find(cuda_available() ? "captures one rank's step, and this job has" : "this rank trains on the CPU"),
              std::string::npos)
        << e;
    {
      Emulation emulated;
      e = testing::error_of([&] { Trainer trainer(world(), o); });
    }
    EXPECT_NE(e.find("captures one rank's step, and this job has " + std::to_string(world().size()) + " ranks"),
              std::string::npos)
        << e;
    comm::barrier(world().comm());
    if (world().is_root()) fs::remove_all(dir);
    return;
  }
  if (!cuda_available()) {
    TrainerOptions o = small_run(dir / "refused");
    o.cuda_graph = true;
    const std::string e = testing::error_of([&] { Trainer trainer(world(), o); });
    EXPECT_NE(e.find("this rank trains on the CPU"), std::string::npos) << e;
  }
  Emulation emulated;
  // Both runs share cuDNN's algorithm choices (one process); deterministic ones, so that atomics do not
  // differ either (read at the first convolution: this test runs alone in gpu_check, which also sets it).
  setenv("RINGTRAIN_CUDNN_DETERMINISTIC", "1", 0);
  for (const OptimizerKind kind : {OptimizerKind::Sgd, OptimizerKind::AdamW}) {
    auto run = [&](const std::string& name, bool graph) {
      TrainerOptions o = small_run(dir / name);
      o.cuda_graph = graph;
      o.optimizer = kind;
      o.accum = 2;  // global batch 24: 4 steps an epoch, the capture at step 2, replays across the epoch's end
      o.steps = 6;
      o.log_jsonl = (dir / (name + ".jsonl")).string();
      Trainer trainer(world(), o);
      auto data = open_shards(dir, {.train_transform = {.pad_crop = 1, .hflip = true}, .device = trainer.device()});
      auto net = small_net(data->info().channels, data->info().classes);
      return trainer.fit(*net, *data);
    };
    const std::string tag = kind == OptimizerKind::Sgd ? "sgd" : "adamw";
    const TrainResult eager = run(tag + "-eager", false), graphed = run(tag + "-graph", true);
    EXPECT_EQ(graphed.steps, 6);
    EXPECT_EQ(graphed.train_loss, eager.train_loss) << tag;
    const auto x = bytes_of(dir / (tag + "-eager") / "ckpt-step00000006.h5"),
               y = bytes_of(dir / (tag + "-graph") / "ckpt-step00000006.h5");
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].first, y[i].first);
      EXPECT_TRUE(x[i].second == y[i].second) << tag << ": " << x[i].first << " differs from the op-by-op run's";
    }
    std::ifstream log(dir / (tag + "-graph.jsonl"));
    bool captured = false;
    for (std::string line; std::getline(log, line);) {
      const nlohmann::json r = nlohmann::json::parse(line);
      if (r["type"] == "cuda_graph") {
        EXPECT_EQ(r["state"], "captured") << line;
        EXPECT_EQ(r["step"], 2) << line;
        captured = true;
      }
      // On a GPU a replayed step is one launch: the step's time must be the device's (the host waits for
      // the step before it), and the summary says which clock it read.
      if (r["type"] == "summary") {
        EXPECT_EQ(r["step_clock"], cuda_available() ? "host, paced by the GPU" : "host") << line;
      }
    }
    EXPECT_TRUE(captured) << "no cuda_graph record in " << tag << "-graph.jsonl";
  }
  // A step that draws dropout masks on the host cannot be replayed (every replay would reuse one mask): the
  // capture fails saying so, and the run goes on op by op, with the op-by-op run's bits. (An emulated graph
  // bakes nothing in.)
  if (emulated.on) {
    fs::remove_all(dir);
    return;
  }
  const StepFn dropped = [](Module& m, const data::Batch& batch) {
    return CrossEntropyLoss()(dropout(m(batch.images), 0.2), batch.labels);
  };
  auto run = [&](const std::string& name, bool graph) {
    TrainerOptions o = small_run(dir / name);
    o.cuda_graph = graph;
    o.steps = 4;
    o.log_jsonl = (dir / (name + ".jsonl")).string();
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    return trainer.fit(*net, *data, dropped);
  };
  EXPECT_EQ(run("dropout-graph", true).train_loss, run("dropout-eager", false).train_loss);
  const auto x = bytes_of(dir / "dropout-eager" / "ckpt-step00000004.h5"),
             y = bytes_of(dir / "dropout-graph" / "ckpt-step00000004.h5");
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(x[i].second == y[i].second) << "dropout: " << x[i].first;
  std::ifstream log(dir / "dropout-graph.jsonl");
  std::string off;
  for (std::string line; std::getline(log, line);)
    if (nlohmann::json::parse(line)["type"] == "cuda_graph") off = line;
  EXPECT_NE(off.find("\"state\":\"off\""), std::string::npos) << off;
  EXPECT_NE(off.find("draws random numbers on the host (dropout)"), std::string::npos) << off;
  fs::remove_all(dir);
}

// What the supervisor acts on: errors about the input are permanent (no restart fixes them), the rest not.
TEST(Trainer, ErrorsAboutTheInputArePermanent) {
  auto permanent = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.permanent();
    }
    ADD_FAILURE() << "no error";
    return false;
  };
  TrainerOptions bad;
  bad.lr = -1;
  EXPECT_TRUE(permanent([&] { Trainer(world(), bad); })) << "a bad flag";
  EXPECT_TRUE(permanent([&] { open_shards("/nonexistent/shards", {}); })) << "missing data";
  const fs::path dir = make_dataset("permanent", 96, 10);
  {
    Trainer trainer(world(), small_run(dir / "a"));
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    trainer.fit(*net, *data);
  }
  // A checkpoint of another global batch: refused, permanently, unless --allow-batch-change.
  TrainerOptions o = small_run(dir / "b");
  o.batch *= 2;
  o.resume = (dir / "a" / "ckpt-step00000003.h5").string();
  {
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    EXPECT_TRUE(permanent([&] { trainer.fit(*net, *data); }));
  }
  o.allow_batch_change = true;
  {
    Trainer trainer(world(), o);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    const TrainResult r = trainer.fit(*net, *data);
    EXPECT_EQ(r.steps, 6);
    EXPECT_EQ(r.steps_run, 3);
  }
  // An injected throw (what a transient failure looks like) is not permanent.
  ::setenv("RINGTRAIN_INJECT", detail::str_cat("throw:", world().size() - 1, ":2").c_str(), 1);
  {
    TrainerOptions t = small_run(dir / "c");
    Trainer trainer(world(), t);
    auto data = open_shards(dir, {.device = trainer.device()});
    auto net = small_net(data->info().channels, data->info().classes);
    if (world().size() == 1) {
      EXPECT_FALSE(permanent([&] { trainer.fit(*net, *data); }));
    }
  }
  ::unsetenv("RINGTRAIN_INJECT");
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

// --recompute on a model of one block: nothing to recompute (the last block stays plain), so the run is
// refused before its first step, permanently, naming the model, rather than run without what was asked.
TEST(Trainer, RecomputeOfAModelOfOneBlockIsRefusedNamingIt) {
  const fs::path dir = make_dataset("one-block", 48, 10);
  TrainerOptions o = small_run(dir / "r");
  o.recompute = true;
  Trainer trainer(world(), o);
  auto data = open_shards(dir, {.device = trainer.device()});
  auto net = std::make_shared<Sequential>();
  net->add(small_net(data->info().channels, data->info().classes));
  try {
    trainer.fit(*net, *data);
    ADD_FAILURE() << "trained";
  } catch (const Error& e) {
    EXPECT_TRUE(e.permanent());
    EXPECT_NE(std::string(e.what()).find("--recompute: none of the model's 1 blocks (Sequential) can be recomputed"),
              std::string::npos)
        << e.what();
  }
  // Two blocks: the first is recomputed and the run trains.
  net->add(std::make_shared<Identity>());
  o.checkpoint_dir = (dir / "r2").string();
  Trainer again(world(), o);
  EXPECT_EQ(again.fit(*net, *data).steps, 6);
}

TEST(Trainer, RanksStartedWithDifferentFlagsFailAtOnceNamingTheFlag) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  TrainerOptions o;
  o.timeout = 0;
  if (world().rank() == world().size() - 1) o.steps = 40;
  const std::string e = testing::error_of([&] { Trainer(world(), o); });
  EXPECT_NE(e.find("the ranks were started with different flags"), std::string::npos) << e;
  EXPECT_NE(e.find("rank " + std::to_string(world().size() - 1) + " ("), std::string::npos) << e;
  EXPECT_NE(e.find("has --steps 40 where rank 0 has 0"), std::string::npos) << e;
  EXPECT_TRUE([&] {
    try {
      Trainer(world(), o);
    } catch (const Error& x) {
      return x.permanent();
    }
    return false;
  }()) << "different flags are an error no restart fixes";
  o = TrainerOptions{};
  o.timeout = 0;
  if (world().rank() == 1) o.log_jsonl = "/tmp/x.jsonl";  // decides whether GPU records are gathered
  EXPECT_NE(
      testing::error_of([&] { Trainer(world(), o); }).find("has --log-jsonl \"(set)\" where rank 0 has \"(unset)\""),
      std::string::npos);
}

TEST(Trainer, OptionsAreCheckedNamingTheFlag) {
  TrainerOptions o;
  o.resume = "auto";
  EXPECT_NE(testing::error_of([&] { Trainer(world(), o); }).find("--resume auto needs --checkpoint-dir"),
            std::string::npos);
  o = TrainerOptions{};
  o.lr = std::nan("");
  EXPECT_NE(testing::error_of([&] { Trainer(world(), o); }).find("--lr must be a positive number"), std::string::npos);
  o = TrainerOptions{};
  o.checkpoint_every = 5;
  EXPECT_NE(testing::error_of([&] { Trainer(world(), o); }).find("--checkpoint-every 5 needs --checkpoint-dir"),
            std::string::npos);
  // --cuda-graph with what a captured step cannot do: refused before anything runs, naming both.
  const std::pair<std::function<void(TrainerOptions&)>, std::string> graph_refusals[] = {
      {[](TrainerOptions& t) { t.device = DeviceChoice::Cpu; }, "but --device cpu trains on the CPU"},
      {[](TrainerOptions& t) { t.profile_steps = 5; }, "--profile times each op"},
      {[](TrainerOptions& t) { t.precision = Precision::FP16; }, "does not combine with --precision fp16"},
      {[](TrainerOptions& t) { t.clip_grad_norm = 1; }, "does not combine with --clip-grad-norm"},
      {[](TrainerOptions& t) { t.zero = 1; }, "does not combine with --zero"},
      {[](TrainerOptions& t) { t.sync_bn = true; }, "does not combine with --sync-bn"},
      {[](TrainerOptions& t) { t.compression = comm::Compression::BF16; }, "does not combine with --compression"},
      {[](TrainerOptions& t) { t.pipeline_stages = 2; }, "does not combine with --pipeline-stages"}};
  for (const auto& [set, want] : graph_refusals) {
    o = TrainerOptions{};
    o.cuda_graph = true;
    set(o);
    const std::string e = testing::error_of([&] { Trainer(world(), o); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_NE(e.find("--cuda-graph"), std::string::npos) << e;
  }
  o = TrainerOptions{};
  o.log_jsonl = "/nonexistent/folder/run.jsonl";
  const std::string e = testing::error_of([&] { Trainer(world(), o); });
  EXPECT_NE(e.find("--log-jsonl: folder '/nonexistent/folder' of '/nonexistent/folder/run.jsonl' does not exist"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace ringtrain::runtime
