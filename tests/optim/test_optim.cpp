// Tests for core/optim: SGD and AdamW trajectories against PyTorch dumps, weight-decay policy,
// state save/restore, schedules against their closed forms, and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <tuple>

#include "core/check.h"
#include "core/ops.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;
using testing::load_golden;

// Runs 5 steps of `make` on the golden quadratic and compares w and b after every step.
void check_trajectory(const std::string& name, double lr,
                      const std::function<std::unique_ptr<Optimizer>(std::vector<NamedParameter>)>& make) {
  auto g = load_golden("optimizer");
  Tensor w = g.at("w0").detach().clone().set_requires_grad(), b = g.at("b0").detach().clone().set_requires_grad();
  auto opt = make({{"w", w}, {"b", b}});
  const Tensor& x = g.at("x");
  const Tensor& y = g.at("y");
  for (int step = 0; step < 5; ++step) {
    opt->zero_grad();
    Tensor r = sub(linear(x, w, b), y);
    sum(mul(r, r)).backward();
    opt->step(lr);
    EXPECT_TRUE(all_close(w, g.at(name + "_w").slice(step, step + 1).reshape(w.shape()), 1e-12, 1e-12))
        << name << " step " << step;
    EXPECT_TRUE(all_close(b, g.at(name + "_b").slice(step, step + 1).reshape(b.shape()), 1e-12, 1e-12))
        << name << " step " << step;
  }
  EXPECT_EQ(opt->steps(), 5);
}

TEST(Optim, SgdNesterovWithWeightDecayMatchesPyTorch) {
  check_trajectory("sgd", 0.1, [](std::vector<NamedParameter> p) {
    return std::make_unique<Sgd>(std::move(p), SgdOptions{.momentum = 0.9, .nesterov = true, .weight_decay = 0.01});
  });
}

TEST(Optim, SgdWithDampeningMatchesPyTorch) {
  check_trajectory("sgd_plain", 0.05, [](std::vector<NamedParameter> p) {
    return std::make_unique<Sgd>(std::move(p), SgdOptions{.momentum = 0.9, .dampening = 0.1});
  });
}

TEST(Optim, SgdWithoutDecayOnBiasMatchesPyTorchParamGroups) {
  check_trajectory("sgd_nodecay_bias", 0.1, [](std::vector<NamedParameter> p) {
    return std::make_unique<Sgd>(
        std::move(p),
        SgdOptions{.momentum = 0.9, .weight_decay = 0.05, .decay_policy = DecayPolicy::ExceptBiasAndNorm});
  });
}

TEST(Optim, AdamWMatchesPyTorch) {
  check_trajectory("adamw", 0.01, [](std::vector<NamedParameter> p) {
    return std::make_unique<AdamW>(std::move(p),
                                   AdamWOptions{.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1});
  });
}

TEST(Optim, AdamWBiasCorrectionCountsEachParametersOwnSteps) {
  // b gets its first gradient at the third step: its first update must be the textbook first Adam
  // step (about lr * sign(g)), not one corrected as if three steps had passed (PyTorch behaves so).
  Tensor a = Tensor::from_vector({1.0}, Shape{1}, DType::F64).set_requires_grad();
  Tensor b = Tensor::from_vector({2.0}, Shape{1}, DType::F64).set_requires_grad();
  AdamW opt({{"a", a}, {"b", b}}, AdamWOptions{.weight_decay = 0.0});
  for (int s = 0; s < 3; ++s) {
    opt.zero_grad();
    Tensor loss = s < 2 ? mul(a, 3.0) : add(mul(a, 3.0), mul(b, 0.5));
    sum(loss).backward();
    opt.step(0.1);
  }
  EXPECT_NEAR(b.item(), 2.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-12);
  auto state = opt.state();
  bool found = false;
  for (auto& [n, t] : state)
    if (n == "b.step") {
      found = true;
      EXPECT_EQ(t.item(), 1.0);
    }
  EXPECT_TRUE(found);
}

TEST(Optim, FusedAdamWMatchesTheTextbookRuleInF32AndBf16) {
  // The fused kernel against the rule written out in f64 here, over parameters with different step
  // counts (q has no gradient at the first step), one without decay (1-D), in f32 and bf16 storage.
  const AdamWOptions o{
      .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1, .decay_policy = DecayPolicy::ExceptBiasAndNorm};
  const double lr = 0.03;
  for (DType dtype : {DType::F32, DType::BF16}) {
    Tensor p = Tensor::uniform(Shape{37, 5}, -1, 1, 11, DType::F64).to(dtype).set_requires_grad();
    Tensor q = Tensor::uniform(Shape{1031}, -1, 1, 12, DType::F64).to(dtype).set_requires_grad();
    struct Ref {
      std::vector<double> p, m, v;
      int t = 0;
      bool decays;
    };
    Ref rp{p.to_vector(), std::vector<double>(p.numel()), std::vector<double>(p.numel()), 0, true};
    Ref rq{q.to_vector(), std::vector<double>(q.numel()), std::vector<double>(q.numel()), 0, false};
    AdamW opt({{"p", p}, {"q", q}}, o);
    for (int step = 0; step < 4; ++step) {
      for (auto [t, r, seed] : {std::tuple{&p, &rp, 20}, std::tuple{&q, &rq, 40}}) {
        if (step == 0 && t == &q) {
          t->zero_grad(true);
          continue;
        }
        Tensor g = Tensor::uniform(t->shape(), -2, 2, static_cast<uint64_t>(seed + step), DType::F64).to(dtype);
        t->set_grad(g);
        const std::vector<double> gv = g.to_vector();
        ++r->t;
        const double bias1 = 1 - std::pow(o.beta1, r->t), bias2 = 1 - std::pow(o.beta2, r->t);
        for (size_t i = 0; i < gv.size(); ++i) {
          if (r->decays) r->p[i] *= 1 - lr * o.weight_decay;
          r->m[i] = o.beta1 * r->m[i] + (1 - o.beta1) * gv[i];
          r->v[i] = o.beta2 * r->v[i] + (1 - o.beta2) * gv[i] * gv[i];
          r->p[i] -= lr / bias1 * r->m[i] / (std::sqrt(r->v[i] / bias2) + o.eps);
        }
      }
      opt.step(lr);
    }
    // bf16 keeps 8 bits: the moments and parameters are rounded at every step.
    const double tol = dtype == DType::F32 ? 2e-6 : 3e-2;
    for (auto [t, r] : {std::pair{&p, &rp}, std::pair{&q, &rq}}) {
      const std::vector<double> got = t->to_vector();
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - r->p[i]));
      EXPECT_LT(worst, tol) << dtype_name(dtype) << " parameter of " << t->numel() << " elements";
    }
    for (auto& [name, t] : opt.state()) {
      if (name == "q.step") {
        EXPECT_EQ(t.item(), 3.0) << "q's first gradient came at the second step";
      }
    }
  }
}

TEST(Optim, StateRoundTripContinuesTheSameTrajectory) {
  auto run = [](bool restore_midway) {
    Tensor w = Tensor::from_vector({1, -2, 3}, Shape{3}, DType::F64).set_requires_grad();
    auto make = [&] { return AdamW({{"w", w}}, AdamWOptions{}); };
    AdamW opt = make();
    for (int s = 0; s < 6; ++s) {
      if (restore_midway && s == 3) {
        auto saved = opt.state();
        std::vector<std::pair<std::string, Tensor>> copy;
        for (auto& [n, t] : saved) copy.emplace_back(n, t.clone());
        opt = make();
        opt.load_state(copy);
      }
      opt.zero_grad();
      sum(mul(mul(w, w), w)).backward();
      opt.step(0.05);
    }
    return w.to_vector();
  };
  EXPECT_EQ(run(false), run(true));
  Tensor w = Tensor::ones(Shape{2}).set_requires_grad();
  Sgd sgd({{"w", w}}, SgdOptions{});
  try {
    sgd.load_state({{"step", Tensor::scalar(1, DType::I64)}, {"w.momentum", Tensor::zeros(Shape{3})}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w.momentum'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sgd.load_state({}), Error);
  EXPECT_EQ(sgd.steps(), 0) << "a failed load changes nothing";
}

TEST(Optim, ParametersWithoutGradientsAreSkippedAndBadOptionsRejected) {
  Tensor a = Tensor::ones(Shape{2}).set_requires_grad(), b = Tensor::ones(Shape{2}).set_requires_grad();
  Sgd sgd({{"a", a}, {"b", b}}, SgdOptions{.momentum = 0.0});
  sum(a * 2.0).backward();
  sgd.step(0.5);
  EXPECT_EQ(a.to_vector(), (std::vector<double>{0, 0}));
  EXPECT_EQ(b.to_vector(), (std::vector<double>{1, 1}));
  EXPECT_THROW(Sgd({{"c", Tensor::ones(Shape{1})}}, SgdOptions{}), Error);  // no requires_grad
  EXPECT_THROW(Sgd({{"a", a}}, SgdOptions{.momentum = 0.0, .nesterov = true}), Error);
  EXPECT_THROW(AdamW({{"a", a}}, AdamWOptions{.beta1 = 1.0}), Error);
}

// stage(lr) + apply() (the halves a CUDA graph captures once and replays) give step(lr)'s bits, with the rate
// and AdamW's bias corrections read from the values stage() wrote, not from the launch: apply()'s launch is
// the same call at every step.
TEST(Optim, StagedStepsGiveTheStepsBitsWithTheRateReadWhenApplied) {
  for (const bool adam : {false, true}) {
    for (const DType dtype : {DType::F32, DType::BF16, DType::F64}) {
      auto run = [&](bool staged) {
        Tensor w = Tensor::from_vector({1, -2, 3, 0.5}, Shape{2, 2}, DType::F64).to(dtype).set_requires_grad();
        Tensor b = Tensor::from_vector({0.25, -1}, Shape{2}, DType::F64).to(dtype).set_requires_grad();
        std::unique_ptr<Optimizer> opt;
        if (adam)
          opt = std::make_unique<AdamW>(
              std::vector<NamedParameter>{{"w", w}, {"b", b}},
              AdamWOptions{.weight_decay = 0.1, .decay_policy = DecayPolicy::ExceptBiasAndNorm});
        else
          opt = std::make_unique<Sgd>(std::vector<NamedParameter>{{"w", w}, {"b", b}},
                                      SgdOptions{.momentum = 0.9, .nesterov = true, .weight_decay = 0.01});
        for (int s = 0; s < 5; ++s) {
          opt->zero_grad();
          sum(mul(mul(w, w), add(w, 1.0))).backward();
          sum(mul(b, b)).backward();
          const double lr = 0.1 / (1 + s);  // a schedule: a baked-in rate would show
          if (!staged || s == 0) {
            if (staged) {
              EXPECT_NE(opt->replayable(), "") << "no state before the first step";
            }
            opt->step(lr);
          } else {
            EXPECT_EQ(opt->replayable(), "");
            opt->stage(lr);
            opt->apply();
          }
        }
        EXPECT_EQ(opt->steps(), 5);
        std::vector<double> out = w.to_vector(), tail = b.to_vector();
        out.insert(out.end(), tail.begin(), tail.end());
        auto state = opt->state();
        for (auto& [name, t] : state) {
          const auto v = t.to_vector();
          out.insert(out.end(), v.begin(), v.end());
        }
        return out;
      };
      EXPECT_EQ(run(false), run(true)) << (adam ? "AdamW " : "SGD ") << dtype;
    }
  }
}

TEST(Optim, StagedStepsAreRefusedWhereTheyCannotHoldSayingWhy) {
  Tensor a = Tensor::ones(Shape{2}).set_requires_grad(), b = Tensor::ones(Shape{2}).set_requires_grad();
  Sgd sgd({{"a", a}, {"b", b}}, SgdOptions{});
  sum(a * 2.0).backward();
  EXPECT_NE(sgd.replayable().find("parameter 'b' has no gradient"), std::string::npos) << sgd.replayable();
  sum(b * 2.0).backward();
  EXPECT_NE(sgd.replayable().find("parameter 'a' has no momentum yet"), std::string::npos) << sgd.replayable();
  EXPECT_THROW(sgd.stage(0.1), Error);
  sgd.step(0.1);
  EXPECT_EQ(sgd.replayable(), "");
  EXPECT_THROW(sgd.apply(), Error) << "apply() without stage()";
  // AdamW: each parameter counts its own steps; replayed launches hold one bias correction for all.
  Tensor c = Tensor::ones(Shape{2}).set_requires_grad(), d = Tensor::ones(Shape{2}).set_requires_grad();
  AdamW adam({{"c", c}, {"d", d}}, AdamWOptions{});
  sum(c * 2.0).backward();
  adam.step(0.1);
  sum(d * 2.0).backward();
  adam.step(0.1);
  EXPECT_NE(adam.replayable().find("'c' and 'd' have taken 2 and 1 steps"), std::string::npos) << adam.replayable();
  EXPECT_THROW(adam.stage(0.1), Error);
  EXPECT_EQ(adam.steps(), 2) << "a refused stage() counts nothing";
}

TEST(Optim, ATensorOrNameListedTwiceIsRefused) {
  // Listed twice, a tensor would be updated twice a step (and by two GPU blocks at once).
  Tensor a = Tensor::ones(Shape{2}).set_requires_grad(), b = Tensor::ones(Shape{2}).set_requires_grad();
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              Sgd({{"a", a}, {"alias", a}}, SgdOptions{});
            }).find("'a' and 'alias' are the same tensor"),
            std::string::npos);
  EXPECT_NE(message([&] {
              AdamW({{"a", a}, {"a", b}}, AdamWOptions{});
            }).find("name 'a' is given twice"),
            std::string::npos);
  Tensor empty1 = Tensor::zeros(Shape{0}).set_requires_grad(), empty2 = Tensor::zeros(Shape{0}).set_requires_grad();
  EXPECT_NO_THROW(Sgd({{"a", a}, {"b", b}, {"e1", empty1}, {"e2", empty2}}, SgdOptions{}));
}

TEST(Schedule, WarmupThenCosineStepAndMultiStep) {
  LrSchedule cosine({.base_lr = 0.4, .total_steps = 110, .warmup_steps = 10, .shape = LrShape::Cosine, .min_lr = 0.0});
  EXPECT_DOUBLE_EQ(cosine.at(0), 0.0);
  EXPECT_DOUBLE_EQ(cosine.at(5), 0.2);
  EXPECT_DOUBLE_EQ(cosine.at(10), 0.4);
  EXPECT_NEAR(cosine.at(60), 0.2, 1e-15);
  EXPECT_NEAR(cosine.at(35), 0.2 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-15);
  EXPECT_NEAR(cosine.at(110), 0.0, 1e-15);
  EXPECT_NEAR(cosine.at(500), 0.0, 1e-15) << "clamped past the end";
  LrSchedule step({.base_lr = 1.0, .shape = LrShape::Step, .step_size = 30, .gamma = 0.1});
  EXPECT_DOUBLE_EQ(step.at(29), 1.0);
  EXPECT_NEAR(step.at(30), 0.1, 1e-15);
  EXPECT_NEAR(step.at(65), 0.01, 1e-15);
  LrSchedule multi({.base_lr = 0.1, .shape = LrShape::MultiStep, .milestones = {100, 150}, .gamma = 0.1});
  EXPECT_DOUBLE_EQ(multi.at(99), 0.1);
  EXPECT_NEAR(multi.at(100), 0.01, 1e-15);
  EXPECT_NEAR(multi.at(150), 0.001, 1e-15);
  EXPECT_THROW(LrSchedule({.base_lr = 0.1, .total_steps = 5, .warmup_steps = 5, .shape = LrShape::Cosine}), Error);
  EXPECT_THROW(LrSchedule({.base_lr = -1}), Error);
}

TEST(Clip, GlobalNormClippingMatchesPyTorchsRule) {
  Tensor a = Tensor::ones(Shape{3}, DType::F64).set_requires_grad();
  Tensor b = Tensor::ones(Shape{1}, DType::F64).set_requires_grad();
  sum(mul(a, 3.0)).backward();  // grad 3,3,3
  sum(mul(b, 4.0)).backward();  // grad 4
  const double norm = clip_grad_norm({a, b}, 1.0);
  EXPECT_NEAR(norm, std::sqrt(27.0 + 16.0), 1e-12);
  const double factor = 1.0 / (norm + 1e-6);
  EXPECT_NEAR(a.grad().to_vector()[0], 3 * factor, 1e-12);
  EXPECT_NEAR(b.grad().to_vector()[0], 4 * factor, 1e-12);
  EXPECT_NEAR(clip_grad_norm({a, b}, 10.0), norm * factor, 1e-9) << "below the limit: unchanged";
}

// A leaf whose gradient holds `values`.
Tensor with_grad(const std::vector<double>& values, DType dtype = DType::F32) {
  Tensor p = Tensor::zeros(Shape{static_cast<int64_t>(values.size())}, dtype).set_requires_grad();
  p.set_grad(Tensor::from_vector(values, Shape{static_cast<int64_t>(values.size())}, dtype));
  return p;
}

TEST(Clip, NormIsExactWhateverTheMagnitudes) {
  // Values over 30 orders of magnitude, many tiny ones: a float sum would lose them; the fixed-point sum is
  // within 2^-30 of the exact one (a long double reference over the f32 values).
  std::vector<double> values;
  for (int i = 0; i < 100000; ++i) values.push_back((i % 7 - 3) * std::pow(10.0, (i % 31) - 20) * (1 + i * 1e-6));
  values.push_back(3e9);
  Tensor p = with_grad(values);
  long double exact = 0;
  for (double v : p.grad().to_vector()) exact += static_cast<long double>(v) * v;
  const double norm = grad_norm({p});
  EXPECT_NEAR(norm, static_cast<double>(std::sqrt(exact)), 1e-9 * norm);
  // f16 and bf16 gradients, and an empty or all-zero list.
  for (DType d : {DType::F16, DType::BF16}) {
    Tensor h = with_grad({3.0, -4.0, 0.5}, d);
    EXPECT_DOUBLE_EQ(grad_norm({h}), std::sqrt(25.25)) << dtype_name(d);
  }
  EXPECT_EQ(grad_norm({}), 0.0);
  EXPECT_EQ(grad_norm({with_grad({0.0, 0.0})}), 0.0);
}

TEST(Clip, NormDoesNotDependOnHowTheElementsAreSplit) {
  // The same elements as one tensor and as slices in another order (split across threads differently):
  // the same bits, which is what lets each ZeRO-1 rank add its shard's part.
  std::vector<double> values;
  for (int i = 0; i < 300001; ++i) values.push_back(std::sin(i * 0.37) * std::exp((i % 13) - 6.0));
  Tensor whole = with_grad(values);
  const double norm = grad_norm({whole});
  const Tensor g = whole.grad();
  std::vector<Tensor> parts;
  const int64_t cuts[] = {0, 1, 77777, 200000, 299999, 300001};
  for (int k = 4; k >= 0; --k) {  // reversed order
    Tensor p = Tensor::zeros(Shape{cuts[k + 1] - cuts[k]}).set_requires_grad();
    p.set_grad(g.slice(cuts[k], cuts[k + 1]).clone());
    parts.push_back(p);
  }
  EXPECT_EQ(grad_norm(parts), norm) << "the norm of the same elements split five ways, in reverse";
}

TEST(Clip, NonFiniteGradientsGiveANonFiniteNormAndAreLeftAlone) {
  Tensor a = with_grad({1.0, std::numeric_limits<double>::infinity()});
  Tensor b = with_grad({std::nan(""), 2.0});
  EXPECT_TRUE(std::isinf(grad_norm({a})));
  EXPECT_TRUE(std::isnan(grad_norm({a, b}))) << "NaN beats inf";
  EXPECT_TRUE(std::isnan(clip_grad_norm({a, b}, 1.0)));
  EXPECT_EQ(b.grad().to_vector()[1], 2.0) << "a non-finite norm scales nothing";
  EXPECT_THROW(clip_grad_norm({a}, 0.0), Error);
}
}  // namespace
}  // namespace ringtrain
