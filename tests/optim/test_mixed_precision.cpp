// Mixed precision: autocast of conv2d / linear / matmul to bf16 or f16 with f32 master weights, and the
// f16 loss scaler (skip on inf/NaN, halve, grow after a run of clean steps). Runs on the CPU (bf16 on
// oneDNN's bf16 kernels where the CPU has them, else through f32); the same code paths serve the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "layers/loss.h"
#include "layers/models/resnet.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;

TEST(Autocast, ConvRunsInBf16AndMasterWeightsGetF32GradientsCloseToF32) {
  Tensor x = Tensor::uniform(Shape{2, 8, 8, 4}, -1, 1, 1);
  Tensor w_ref = Tensor::uniform(Shape{6, 3, 3, 4}, -0.5, 0.5, 2).set_requires_grad();
  Tensor w = w_ref.detach().clone().set_requires_grad();
  Tensor g = Tensor::uniform(Shape{2, 8, 8, 6}, -1, 1, 3);
  Tensor y_ref = conv2d(x, w_ref, Tensor(), {.pad_h = 1, .pad_w = 1});
  sum(mul(y_ref, g)).backward();
  Tensor y;
  {
    AutocastGuard autocast(DType::BF16);
    y = conv2d(x, w, Tensor(), {.pad_h = 1, .pad_w = 1});
    EXPECT_EQ(y.dtype(), DType::BF16);
    sum(mul(y.to(DType::F32), g)).backward();
  }
  EXPECT_TRUE(all_close(y.to(DType::F32), y_ref, 3e-2, 3e-2));
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::F32) << "master weights keep f32 gradients";
  EXPECT_TRUE(all_close(w.grad(), w_ref.grad(), 3e-2, 0.3));
}

TEST(Autocast, LinearAndMatmulFollowTheGuardWhichNestsAndRestores) {
  Tensor x = Tensor::uniform(Shape{4, 8}, -1, 1, 1), w = Tensor::uniform(Shape{3, 8}, -1, 1, 2);
  Tensor b = Tensor::uniform(Shape{3}, -1, 1, 3);
  EXPECT_FALSE(autocast_dtype().has_value());
  {
    AutocastGuard outer(DType::F16);
    EXPECT_EQ(linear(x, w, b).dtype(), DType::F16);
    EXPECT_EQ(matmul(x, Tensor::uniform(Shape{8, 2}, -1, 1, 4)).dtype(), DType::F16);
    {
      AutocastGuard off(std::nullopt);
      EXPECT_EQ(linear(x, w, b).dtype(), DType::F32);
    }
    EXPECT_EQ(autocast_dtype(), DType::F16);
    // f64 (gradient checks) is never autocast.
    EXPECT_EQ(matmul(x.to(DType::F64), w.to(DType::F64).reshape(Shape{8, 3})).dtype(), DType::F64);
  }
  EXPECT_FALSE(autocast_dtype().has_value());
  EXPECT_THROW(AutocastGuard(DType::F32), Error);
}

TEST(Autocast, Bf16ResNetTrainingLowersTheLoss) {
  manual_seed(5);
  ResNet model("resnet20", {.in_channels = 3, .num_classes = 4});
  Sgd opt(as_named(model.named_parameters()), {.momentum = 0.9, .weight_decay = 0.0});
  CrossEntropyLoss loss_fn;
  Tensor x = Tensor::uniform(Shape{16, 8, 8, 3}, -1, 1, 7);
  std::vector<double> y(16);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<double>(i % 4);
  Tensor labels = Tensor::from_vector(y, Shape{16}, DType::I64);
  double first = 0, last = 0;
  for (int step = 0; step < 12; ++step) {
    Tensor loss;
    {
      AutocastGuard autocast(DType::BF16);
      loss = loss_fn(model(x), labels);
    }
    EXPECT_EQ(loss.dtype(), DType::F32);
    loss.backward();
    opt.step(0.05);
    opt.zero_grad();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, first * 0.7) << "bf16 autocast training must still learn a fixed batch";
  for (const auto& [name, p] : model.named_parameters()) EXPECT_EQ(p.dtype(), DType::F32) << name;
}

std::vector<Tensor> params_with_grads(const std::vector<double>& grads) {
  std::vector<Tensor> params;
  for (double g : grads) {
    Tensor p = Tensor::zeros(Shape{2}).set_requires_grad();
    p.set_grad(Tensor::full(Shape{2}, g));
    params.push_back(p);
  }
  return params;
}

TEST(GradScaler, FiniteGradientsAreUnscaledAndTheStepIsTaken) {
  GradScaler scaler({.init_scale = 1024.0});
  auto params = params_with_grads({1024.0, -2048.0});
  Sgd opt({{"a", params[0]}, {"b", params[1]}}, {.momentum = 0.0});
  EXPECT_DOUBLE_EQ(scaler.scale_loss(Tensor::full(Shape{}, 2.0)).item(), 2048.0);
  EXPECT_TRUE(scaler.step(opt, params, 0.5));
  EXPECT_EQ(params[0].grad().to_vector(), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(params[0].to_vector(), (std::vector<double>{-0.5, -0.5}));
  EXPECT_EQ(params[1].to_vector(), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(GradScaler, InfOrNanSkipsTheStepAndHalvesTheScale) {
  for (double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    GradScaler scaler({.init_scale = 1024.0});
    auto params = params_with_grads({1.0, bad});
    Sgd opt({{"a", params[0]}, {"b", params[1]}}, {.momentum = 0.0});
    EXPECT_FALSE(scaler.step(opt, params, 0.5));
    EXPECT_EQ(params[0].to_vector(), (std::vector<double>{0.0, 0.0})) << "no parameter may move";
    EXPECT_EQ(opt.steps(), 0);
    EXPECT_EQ(scaler.scale(), 512.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
}

TEST(GradScaler, ChecksEveryDtypeAndCatchesOverflowFromUnscalingItself) {
  // Gradients in f32, bf16 and f16 (one fused call per dtype). A scale below 1 multiplies on unscaling:
  // a finite f16 gradient of 60000 becomes 240000, past f16's 65504, and that must count as inf too.
  auto grads_of = [](double f16_value, double bf16_value) {
    std::vector<Tensor> params;
    for (auto [dtype, value] :
         {std::pair{DType::F32, 1.5}, std::pair{DType::BF16, bf16_value}, std::pair{DType::F16, f16_value}}) {
      Tensor p = Tensor::zeros(Shape{300}, dtype).set_requires_grad();
      Tensor g = Tensor::full(Shape{300}, 1.0, dtype);
      g.slice(257, 258).fill_(value);
      p.set_grad(g);
      params.push_back(p);
    }
    return params;
  };
  GradScaler quarter({.init_scale = 0.25});
  auto fine = grads_of(1000.0, 3.0);
  EXPECT_TRUE(quarter.unscale(fine));
  EXPECT_EQ(fine[0].grad().to_vector()[0], 4.0);
  EXPECT_EQ(fine[1].grad().to_vector()[257], 12.0);
  EXPECT_EQ(fine[2].grad().to_vector()[257], 4000.0);
  EXPECT_FALSE(quarter.unscale(grads_of(60000.0, 3.0))) << "f16 overflow on unscaling";
  EXPECT_FALSE(GradScaler({.init_scale = 2.0}).unscale(grads_of(1.0, std::numeric_limits<double>::infinity())))
      << "an inf in the bf16 group alone";
  EXPECT_TRUE(GradScaler({.init_scale = 2.0}).unscale({Tensor::zeros(Shape{2}).set_requires_grad()}))
      << "parameters without gradients are skipped";
}

TEST(GradScaler, GrowsAfterTheIntervalOfCleanStepsAndRestores) {
  GradScaler scaler({.init_scale = 8.0, .growth_interval = 3});
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 16.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  scaler.update(false);
  scaler.update(true);  // an overflow resets the run
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 8.0);
  GradScaler restored;
  restored.load(scaler.scale(), scaler.growth_tracker());
  EXPECT_EQ(restored.scale(), 8.0);
  EXPECT_EQ(restored.growth_tracker(), 2);
  EXPECT_THROW(restored.load(0.0, 0), Error);
  EXPECT_THROW(GradScaler({.init_scale = -1.0}), Error);
  EXPECT_THROW(GradScaler({.growth_interval = 0}), Error);
}

TEST(GradScaler, F16AutocastTrainingWithScalingLowersTheLoss) {
  manual_seed(6);
  ResNet model("resnet20", {.in_channels = 3, .num_classes = 4});
  auto named = model.named_parameters();
  std::vector<Tensor> params;
  for (const auto& [name, p] : named) params.push_back(p);
  Sgd opt(as_named(named), {.momentum = 0.9, .weight_decay = 0.0});
  GradScaler scaler;
  CrossEntropyLoss loss_fn;
  Tensor x = Tensor::uniform(Shape{16, 8, 8, 3}, -1, 1, 8);
  std::vector<double> y(16);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<double>((i * 3) % 4);
  Tensor labels = Tensor::from_vector(y, Shape{16}, DType::I64);
  double first = 0, last = 0;
  int taken = 0;
  for (int step = 0; step < 14; ++step) {
    Tensor loss;
    {
      AutocastGuard autocast(DType::F16);
      loss = loss_fn(model(x), labels);
    }
    scaler.scale_loss(loss).backward();
    taken += scaler.step(opt, params, 0.05) ? 1 : 0;
    opt.zero_grad();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_GE(taken, 10) << "at most a few overflow steps are skipped while the scale settles";
  EXPECT_LT(last, first * 0.7);
}

}  // namespace
}  // namespace ringtrain
