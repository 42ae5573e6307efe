// Runs under mpirun with 2 and 4 ranks: the point-to-point channel (messages in both directions at once, in
// order, of any size; a size disagreement is an error naming both sides), and the Trainer with
// --pipeline-stages: 1F1B and GPipe train the same bits, a stage releases the other stages' weights, the
// checkpoint is the whole model (it resumes bitwise, also with another stage count), evaluation scores every
// test image once, and what a pipeline cannot run is refused naming the model or the flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "comm/host_collectives.h"
#include "comm/p2p.h"
#include "comm/world.h"
#include "core/ops.h"
#include "io/checkpoint.h"
#include "layers/basic.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/pooling.h"
#include "mpi_datasets.h"
#include "runtime/cluster/fault_injection.h"
#include "runtime/cluster/watchdog.h"
#include "runtime/config/data_source.h"
#include "runtime/loop/trainer.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/step/evaluate.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {
namespace fs = std::filesystem;

comm::World& world() { return comm::World::init(); }

// 0, 1, ..., n - 1 plus `offset`, as f32.
Tensor counting(int64_t n, double offset) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i) + offset;
  return Tensor::from_vector(v, Shape{n});
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.nbytes())) == 0;
}

fs::path make_dataset(const std::string& what, int64_t train_count, int64_t test_count) {
  return ringtrain::testing::make_dataset("rt_pipeline", what, train_count, test_count);
}

// Eight blocks (conv, bn, relu, conv, relu, dropout, pool, linear): enough for 4 stages.
std::shared_ptr<Sequential> net(int64_t channels, int64_t classes) {
  auto n = std::make_shared<Sequential>();
  n->add(std::make_shared<Conv2d>(channels, 8, Conv2dOptions{.padding = 1}))
      .add(std::make_shared<BatchNorm2d>(8))
      .add(std::make_shared<ReLU>())
      .add(std::make_shared<Conv2d>(8, 8, Conv2dOptions{.padding = 1}))
      .add(std::make_shared<ReLU>())
      .add(std::make_shared<Dropout>(0.25))
      .add(std::make_shared<GlobalAvgPool>())
      .add(std::make_shared<Linear>(8, classes));
  return n;
}

TrainerOptions pipelined(const fs::path& ckpt, int stages) {
  TrainerOptions o;
  o.program = "test_pipeline";
  o.model_name = "pipe-cnn";
  o.pipeline_stages = stages;
  o.batch = 4 * stages / world().size();  // one replica of 4 images, or two of 2
  o.accum = 3;
  o.steps = 6;
  o.lr = 0.05;
  o.optimizer = OptimizerKind::AdamW;
  o.clip_grad_norm = 0.5;  // the norm combines over the stages
  o.threads = 1;
  o.log_every = 100;
  o.checkpoint_dir = ckpt.string();
  o.checkpoint_every = ckpt.empty() ? 0 : 3;
  o.timeout = 120;
  return o;
}

struct Trained {
  TrainResult result;
  int64_t released = 0, held = 0;  // this rank's parameters without and with memory
};

Trained train(const fs::path& data_dir, const TrainerOptions& o) {
  Trainer trainer(world(), o);
  auto data = open_shards(data_dir, {.device = trainer.device()});
  auto model = net(data->info().channels, data->info().classes);
  Trained r;
  r.result = trainer.fit(*model, *data);
  for (const auto& [name, p] : model->named_parameters()) (p.released() ? r.released : r.held) += 1;
  return r;
}

void expect_same_checkpoints(const fs::path& a, const fs::path& b) {
  if (!world().is_root()) return;
  const Checkpoint x = load_checkpoint(a), y = load_checkpoint(b);
  for (const auto& [part_x, part_y] : {std::pair{&x.model, &y.model}, std::pair{&x.optimizer, &y.optimizer}}) {
    ASSERT_EQ(part_x->size(), part_y->size()) << a << " vs " << b;
    for (size_t i = 0; i < part_x->size(); ++i) {
      const auto& [name, t] = (*part_x)[i];
      EXPECT_EQ(name, (*part_y)[i].first);
      const Tensor& u = (*part_y)[i].second;
      ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
      EXPECT_TRUE(same_bits(t, u)) << name << " differs: " << a << " vs " << b;
    }
  }
}

TEST(Channel, CarriesMessagesBothWaysInOrderOfAnySize) {
  const int n = world().size(), me = world().rank();
  auto fwd = comm::make_channel(world().comm(), Device::cpu(), "activations");
  auto back = comm::make_channel(world().comm(), Device::cpu(), "gradients");
  // Every rank sends to its right and its left at once, three messages each way (0, 5 and 300000 floats).
  const std::vector<int64_t> sizes = {0, 5, 300000};
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  std::vector<comm::WorkPtr> work;
  std::vector<Tensor> sent, got_r, got_l;
  for (size_t k = 0; k < sizes.size(); ++k) {
    Tensor t = counting(sizes[k], me * 1000 + static_cast<int>(k));
    sent.push_back(t);
    got_r.push_back(Tensor::empty(Shape{sizes[k]}, DType::F32));
    got_l.push_back(Tensor::empty(Shape{sizes[k]}, DType::F32));
    work.push_back(fwd->send(t, right));
    work.push_back(back->send(t, left));
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    fwd->recv(got_l[k], left)->wait();  // what the left neighbour sent right
    back->recv(got_r[k], right)->wait();
  }
  for (auto& w : work) w->wait();
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_TRUE(same_bits(got_l[k], counting(sizes[k], left * 1000 + static_cast<int>(k))))
        << "message " << k << " from rank " << left;
    EXPECT_TRUE(same_bits(got_r[k], counting(sizes[k], right * 1000 + static_cast<int>(k))))
        << "message " << k << " from rank " << right;
  }
  fwd->close();
  back->close();
}

TEST(Channel, AReceiveOfAnotherSizeIsAnErrorNamingBothSides) {
  auto ch = comm::make_channel(world().comm(), Device::cpu(), "activations");
  std::string error;
  if (world().rank() == 0) {
    ch->send(Tensor::zeros(Shape{10}, DType::F32), 1)->wait();
  } else if (world().rank() == 1) {
    Tensor t = Tensor::empty(Shape{12}, DType::F32);
    error = testing::error_of([&] { ch->recv(t, 0)->wait(); });
    EXPECT_NE(error.find("activations channel: receive from rank 0"), std::string::npos) << error;
    EXPECT_NE(error.find("received 40 bytes from rank 0 where 48 were expected"), std::string::npos) << error;
  }
  comm::barrier(world().comm());
  ch->close();
  EXPECT_NE(testing::error_of([&] { ch->send(Tensor::zeros(Shape{1}, DType::F32), 0); }).find("the channel is closed"),
            std::string::npos);
}

// GPU tensors: by NCCL where every rank has a GPU of its own, else through host memory by MPI (ranks
// sharing a GPU, as on a one-GPU machine): the same messages either way.
TEST(Channel, CarriesGpuTensors) {
  RT_REQUIRE_CUDA();
  const int n = world().size(), me = world().rank();
  const Device gpu = Device::cuda(0);
  auto fwd = comm::make_channel(world().comm(), gpu, "activations");
  auto back = comm::make_channel(world().comm(), gpu, "gradients");
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  std::vector<comm::WorkPtr> work;
  std::vector<Tensor> got_l, got_r;
  for (int64_t size : {int64_t{0}, int64_t{5}, int64_t{300000}}) {
    const Tensor t = counting(size, me * 1000 + static_cast<double>(size)).to(gpu);
    work.push_back(fwd->send(t, right));
    work.push_back(back->send(t, left));
    got_l.push_back(Tensor::empty(Shape{size}, DType::F32, gpu));
    got_r.push_back(Tensor::empty(Shape{size}, DType::F32, gpu));
    work.push_back(fwd->recv(got_l.back(), left));
    work.push_back(back->recv(got_r.back(), right));
  }
  for (auto& w : work) w->wait();
  synchronize(gpu);
  size_t k = 0;
  for (int64_t size : {int64_t{0}, int64_t{5}, int64_t{300000}}) {
    EXPECT_TRUE(same_bits(got_l[k].to(Device::cpu()), counting(size, left * 1000 + static_cast<double>(size))));
    EXPECT_TRUE(same_bits(got_r[k].to(Device::cpu()), counting(size, right * 1000 + static_cast<double>(size))));
    ++k;
  }
  fwd->close();
  back->close();
}

// Pipelined training on the GPU: both schedules run (cuDNN's algorithms may differ between runs, so they
// agree to float noise) and the checkpoint is the whole model.
TEST(Pipeline, TrainsOnTheGpu) {
  RT_REQUIRE_CUDA();
  const fs::path dir = make_dataset("gpu", 96, 10);
  const int n = world().size();
  TrainerOptions o = pipelined(dir / "onef", n);
  o.device = DeviceChoice::Cuda;
  o.allow_shared_gpu = true;  // one GPU for every stage: the channel stages through host memory
  const Trained onef = train(dir, o);
  o = pipelined(dir / "gpipe", n);
  o.device = DeviceChoice::Cuda;
  o.allow_shared_gpu = true;
  o.pipeline_schedule = PipelineSchedule::GPipe;
  const Trained gpipe = train(dir, o);
  EXPECT_NEAR(onef.result.train_loss, gpipe.result.train_loss, 1e-3 * std::abs(onef.result.train_loss));
  ASSERT_TRUE(onef.result.eval);
  EXPECT_EQ(onef.result.eval->count, 10);
  if (world().is_root()) {
    auto whole = net(3, 3);
    whole->load_state_dict(load_checkpoint(dir / "onef" / "ckpt-step00000006.h5").model);
  }
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

// Every stage count that divides the world, both schedules: the same bits (the same ops on the same
// micro-batches, gradients accumulated in micro-batch order); each rank holds its stage's weights only.
TEST(Pipeline, SchedulesTrainTheSameBitsAndStagesHoldTheirWeightsOnly) {
  const fs::path dir = make_dataset("schedules", 96, 10);
  const int n = world().size();
  TrainerOptions o = pipelined(dir / "onef", n);
  const Trained onef = train(dir, o);
  o = pipelined(dir / "gpipe", n);
  o.pipeline_schedule = PipelineSchedule::GPipe;
  const Trained gpipe = train(dir, o);
  expect_same_checkpoints(dir / "onef" / "ckpt-step00000006.h5", dir / "gpipe" / "ckpt-step00000006.h5");
  EXPECT_EQ(onef.result.train_loss, gpipe.result.train_loss);
  EXPECT_GT(onef.result.train_loss, 0);  // the last stage's loss, on every rank's result
  ASSERT_TRUE(onef.result.eval);
  EXPECT_EQ(onef.result.eval->count, 10);
  // Every parameter is held by exactly one stage (a stage may hold none: ReLU or dropout only).
  const int64_t held_anywhere = comm::all_reduce(world().comm(), static_cast<double>(onef.held), comm::HostOp::Sum);
  EXPECT_EQ(held_anywhere, onef.held + onef.released);
  EXPECT_GT(onef.released, 0);
  // An explicit split trains the same as the balanced one when it is the same split; the first stage
  // taking only the first conv is another split, still exact.
  o = pipelined(dir / "given", n);
  o.pipeline_split = n == 2 ? "0,1" : "0,1,2,7";
  const Trained given = train(dir, o);
  expect_same_checkpoints(dir / "onef" / "ckpt-step00000006.h5", dir / "given" / "ckpt-step00000006.h5");
  // --pipeline-recompute: the forward again in backward, with the same dropout masks and the BatchNorm
  // statistics updated once: the same bits, both schedules.
  for (const auto sched : {PipelineSchedule::OneFOneB, PipelineSchedule::GPipe}) {
    o = pipelined(dir / "recompute", n);
    o.pipeline_recompute = true;
    o.pipeline_schedule = sched;
    o.pipeline_split = n == 2 ? "0,5" : "0,3,5,7";  // the dropout with its stage's other layers
    const Trained again = train(dir, o);
    expect_same_checkpoints(dir / "onef" / "ckpt-step00000006.h5", dir / "recompute" / "ckpt-step00000006.h5");
    EXPECT_EQ(again.result.train_loss, onef.result.train_loss);
    if (world().is_root()) fs::remove_all(dir / "recompute");
  }
  // Stages x replicas against replicas without stages (the same per-replica batch, so the same BatchNorm
  // statistics): tests/apps/pipeline.sh, which can run both world sizes.
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

TEST(Pipeline, ACheckpointIsTheWholeModelAndResumesBitwise) {
  const fs::path dir = make_dataset("resume", 96, 10);
  const int n = world().size();
  train(dir, pipelined(dir / "full", n));
  if (world().is_root()) {
    const Checkpoint c = load_checkpoint(dir / "full" / "ckpt-step00000003.h5");
    auto whole = net(3, 3);
    EXPECT_EQ(c.model.size(), whole->state_dict().size());
    whole->load_state_dict(c.model);  // every entry, shapes and names of the model without stages
    for (const auto& [name, t] : c.model) EXPECT_FALSE(t.released()) << name;
  }
  // Resumed at step 3 by the same stages, and (4 ranks) by another split and schedule. Other stage counts
  // at one replica need other world sizes: tests/apps/pipeline.sh resumes with 1 process and with 4 stages.
  TrainerOptions o = pipelined(dir / "again", n);
  o.resume = (dir / "full" / "ckpt-step00000003.h5").string();
  const Trained again = train(dir, o);
  EXPECT_EQ(again.result.steps_run, 3);
  expect_same_checkpoints(dir / "full" / "ckpt-step00000006.h5", dir / "again" / "ckpt-step00000006.h5");
  if (n == 4) {
    o = pipelined(dir / "other", 4);
    o.pipeline_schedule = PipelineSchedule::GPipe;
    o.pipeline_split = "0,2,3,7";
    o.resume = (dir / "full" / "ckpt-step00000003.h5").string();
    train(dir, o);
    expect_same_checkpoints(dir / "full" / "ckpt-step00000006.h5", dir / "other" / "ckpt-step00000006.h5");
  }
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

// A module that is no sequence, and one whose blocks leave a parameter out.
class NoBlocks : public Module {
 public:
  NoBlocks() : fc_(register_module("fc", std::make_shared<Linear>(6 * 6 * 3, 3))) {}
  Tensor forward(const Tensor& x) override { return fc_->forward(x.reshape(Shape{x.shape()[0], 6 * 6 * 3})); }
  std::string type_name() const override { return "NoBlocks"; }

 protected:
  std::shared_ptr<Linear> fc_;
};
class HidesAParameter : public NoBlocks {
 public:
  HidesAParameter() : extra_(register_module("extra", std::make_shared<Linear>(3, 3))) {}
  std::vector<Block> blocks() override {
    auto fc = fc_;
    return {{"flat",
             {},
             [](const Tensor& x) {
               return x.reshape(Shape{x.shape()[0], 6 * 6 * 3});
             },
             {}},
            {"fc", {fc}, [fc](const Tensor& x) { return fc->forward(x); }, {}}};
  }
  std::string type_name() const override { return "HidesAParameter"; }

 private:
  std::shared_ptr<Linear> extra_;
};

// Evaluation through the stages takes evaluate()'s options: every test image scored once, on_batch called
// for each of the replica's batches and on_wait once, on every stage; a custom logits function is refused.
TEST(Pipeline, EvaluationTakesTheOptionsOfEvaluate) {
  const fs::path dir = make_dataset("eval", 24, 10);
  const int n = world().size();
  TrainerOptions o = pipelined("", n);
  o.accum = 1;
  auto data = open_shards(dir, {.device = Device::cpu()});
  manual_seed(7);  // the same starting weights on every rank, as the Trainer's seed gives
  auto model = net(data->info().channels, data->info().classes);
  Watchdog dog(world(), 120);
  const FaultInjection none;
  Pipeline pipeline(world(), o, Device::cpu(), *model, data->info(), dog, none);
  EvalOptions eo;
  eo.batch = 4;
  int batches = 0, waits = 0;
  eo.on_batch = [&] { ++batches; };
  eo.on_wait = [&] { ++waits; };
  const EvalResult e = pipeline.evaluate(data->test_loader(), data->info().test_size, eo, 0);
  EXPECT_EQ(e.count, 10);
  EXPECT_EQ(batches, 3);  // 10 images in batches of 4, one replica
  EXPECT_EQ(waits, 1);
  eo.logits = [](Module& m, const Tensor& images) { return m(images); };
  const std::string error =
      testing::error_of([&] { pipeline.evaluate(data->test_loader(), data->info().test_size, eo, 0); });
  EXPECT_NE(error.find("a custom logits function (EvalOptions::logits) sees the whole model"), std::string::npos)
      << error;
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

TEST(Pipeline, WhatAPipelineCannotRunIsRefusedNamingIt) {
  const fs::path dir = make_dataset("refused", 48, 0);
  const int n = world().size();
  auto error_with = [&](Module& model, const StepFn& step) {
    Trainer trainer(world(), pipelined("", n));
    auto data = open_shards(dir, {.device = trainer.device()});
    return testing::error_of([&] { trainer.fit(model, *data, step); });
  };
  NoBlocks plain;
  std::string e = error_with(plain, {});
  EXPECT_NE(e.find("the model (NoBlocks) is no sequence of blocks to split into stages"), std::string::npos) << e;
  HidesAParameter hides;
  e = error_with(hides, {});
  if (n > 2) {
    EXPECT_NE(e.find("the model has only 2 blocks (each stage needs at least one)"), std::string::npos) << e;
  } else {
    EXPECT_NE(e.find("'extra.weight' of the model (HidesAParameter) belongs to none of its blocks()"),
              std::string::npos)
        << e;
  }
  auto model = net(3, 3);
  e = error_with(*model, [](Module& m, const data::Batch& b) { return mean(m(b.images)); });
  EXPECT_NE(e.find("a custom step function"), std::string::npos) << e;
  // The world must be stages x replicas.
  TrainerOptions o = pipelined("", n);
  o.pipeline_stages = n + 1;
  e = testing::error_of([&] { Trainer(world(), o); });
  EXPECT_NE(
      e.find("--pipeline-stages " + std::to_string(n + 1) + " does not divide the " + std::to_string(n) + " ranks"),
      std::string::npos)
      << e;
  comm::barrier(world().comm());
  if (world().is_root()) fs::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain::runtime
