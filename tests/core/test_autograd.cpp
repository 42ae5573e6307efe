// Tests for core/autograd.h: accumulation, hooks, no_grad, graph lifetime, and error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::error_of;

TEST(Autograd, SimpleChainAndLeafUsedTwice) {
  Tensor x = Tensor::from_vector({1, 2, 3}, Shape{3}, DType::F64).set_requires_grad();
  Tensor y = sum(mul(x, x) + x * 3.0);  // dy/dx = 2x + 3
  EXPECT_FALSE(x.grad().defined());
  y.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{5, 7, 9}));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn()->op, "sum");
}

TEST(Autograd, AccumulatesAcrossBackwardCallsUntilZeroed) {
  Tensor w = Tensor::from_vector({2}, Shape{1}, DType::F64).set_requires_grad();
  for (int i = 0; i < 3; ++i) sum(w * 5.0).backward();
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{15}));
  w.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{0}));
  w.zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

TEST(Autograd, AccumulatesIntoAPresetGradientBuffer) {
  // GradSync points .grad at a view of a flat bucket; backward must write into that memory.
  Tensor bucket = Tensor::zeros(Shape{5}, DType::F64);
  Tensor w = Tensor::from_vector({1, 1, 1}, Shape{3}, DType::F64).set_requires_grad();
  w.set_grad(bucket.slice(1, 4));
  sum(w * 2.0).backward();
  EXPECT_EQ(bucket.to_vector(), (std::vector<double>{0, 2, 2, 2, 0}));
  EXPECT_THROW(w.set_grad(Tensor::zeros(Shape{4}, DType::F64)), Error);
}

TEST(Autograd, ReadyHooksFireOncePerPassAfterTheGradientIsComplete) {
  Tensor a = Tensor::from_vector({1, 2}, Shape{2}, DType::F64).set_requires_grad();
  Tensor b = Tensor::from_vector({3, 4}, Shape{2}, DType::F64).set_requires_grad();
  std::vector<std::string> order;
  std::vector<double> a_grad_seen;
  a.register_ready_hook([&](Tensor& leaf) {
    order.push_back("a");
    a_grad_seen = leaf.grad().to_vector();
  });
  b.register_ready_hook([&](Tensor&) { order.push_back("b"); });
  // a is used by the first and last ops; its hook must see the sum of both contributions.
  Tensor h = a * 2.0;
  Tensor out = sum(mul(h, b) + a);
  out.backward();
  EXPECT_EQ(order.size(), 2u);
  EXPECT_EQ(a_grad_seen, (std::vector<double>{2 * 3 + 1, 2 * 4 + 1}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{2, 4}));
}

TEST(Autograd, HooksRunInReverseOfForwardOrder) {
  // Parameters used later in the forward become ready earlier in the backward (GradSync relies on it).
  std::vector<Tensor> layers;
  std::vector<int> ready;
  for (int i = 0; i < 4; ++i) {
    layers.push_back(Tensor::uniform(Shape{3, 3}, -1, 1, static_cast<uint64_t>(i), DType::F64).set_requires_grad());
    layers.back().register_ready_hook([&ready, i](Tensor&) { ready.push_back(i); });
  }
  Tensor x = Tensor::ones(Shape{2, 3}, DType::F64);
  for (auto& w : layers) x = relu(matmul(x, w));
  sum(x).backward();
  EXPECT_EQ(ready, (std::vector<int>{3, 2, 1, 0}));
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = Tensor::ones(Shape{2}, DType::F64).set_requires_grad();
  Tensor y;
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    y = x * 2.0;
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_FALSE(y.requires_grad());
  EXPECT_FALSE(y.grad_fn());
  std::string err = error_of([&] { sum(y).backward(); });
  EXPECT_NE(err.find("does not require grad"), std::string::npos) << err;
}

TEST(Autograd, BackwardFromNonScalarNamesShapeAndOp) {
  Tensor x = Tensor::ones(Shape{2, 3}, DType::F64).set_requires_grad();
  Tensor y = x * 2.0;
  std::string err = error_of([&] { y.backward(); });
  EXPECT_NE(err.find("scalar"), std::string::npos) << err;
  EXPECT_NE(err.find("[2, 3]"), std::string::npos) << err;
  EXPECT_NE(err.find("mul_scalar"), std::string::npos) << err;
  // With an explicit gradient of the right shape it works.
  y.backward(Tensor::ones(Shape{2, 3}, DType::F64));
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(6, 2.0));
  err = error_of([&] { (x * 3.0).backward(Tensor::ones(Shape{3, 2}, DType::F64)); });
  EXPECT_NE(err.find("does not match"), std::string::npos) << err;
}

TEST(Autograd, BackwardThroughFreedGraphIsAnError) {
  Tensor x = Tensor::ones(Shape{2}, DType::F64).set_requires_grad();
  Tensor y = sum(exp(x));
  y.backward();
  std::string err = error_of([&] { y.backward(); });
  EXPECT_NE(err.find("already freed"), std::string::npos) << err;
  EXPECT_NE(err.find("retain_graph"), std::string::npos) << err;
  // retain_graph keeps it usable.
  Tensor z = sum(exp(x));
  x.zero_grad();
  z.backward(Tensor(), /*retain_graph=*/true);
  z.backward();
  EXPECT_NEAR(x.grad().to_vector()[0], 2 * std::exp(1.0), 1e-12);
}

// A node's saved tensors go as soon as it has run: when the leaf's gradient is ready, the chain's saved
// outputs are gone (only the root, still held here, and the gradients in flight remain).
TEST(Autograd, SavedTensorsGoAsTheBackwardPassesThem) {
  constexpr int64_t n = 1 << 18;  // 1 MiB of f32 per tensor
  Tensor x = Tensor::ones(Shape{n}).set_requires_grad();
  Tensor y = x;
  for (int i = 0; i < 16; ++i) y = exp(y * 0.01);  // each exp keeps its output: 16 MiB held after forward
  const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
  int64_t at_leaf = -1;
  x.register_ready_hook([&](Tensor&) { at_leaf = memory_stats(Device::cpu()).allocated_bytes; });
  y.backward(Tensor::ones(Shape{n}));
  ASSERT_GE(at_leaf, 0);
  EXPECT_LT(at_leaf, before - 10 * n * 4) << "held " << before << " bytes after forward, " << at_leaf << " at the leaf";
}

TEST(Autograd, OpShapeAndDtypeMismatchesNameTheOp) {
  Tensor a = Tensor::ones(Shape{2, 3});
  std::string err = error_of([&] { add(a, Tensor::ones(Shape{4})); });
  EXPECT_NE(err.find("'add'"), std::string::npos) << err;
  EXPECT_NE(err.find("[2, 3]"), std::string::npos) << err;
  EXPECT_NE(err.find("[4]"), std::string::npos) << err;
  err = error_of([&] { mul(a, Tensor::ones(Shape{2, 3}, DType::F64)); });
  EXPECT_NE(err.find("'mul'"), std::string::npos) << err;
  EXPECT_NE(err.find("dtype mismatch"), std::string::npos) << err;
  err = error_of([&] { matmul(a, Tensor::ones(Shape{2, 3})); });
  EXPECT_NE(err.find("'matmul'"), std::string::npos) << err;
  EXPECT_NE(err.find("inner dimensions"), std::string::npos) << err;
  err = error_of([&] { Tensor::ones(Shape{2}, DType::I32).set_requires_grad(); });
  EXPECT_NE(err.find("floating"), std::string::npos) << err;
  err = error_of([&] { (a.detach().set_requires_grad() * 2.0).set_requires_grad(); });
  EXPECT_NE(err.find("only leaves"), std::string::npos) << err;
}

TEST(Autograd, DeepChainNeitherOverflowsTheStackNorLeaks) {
  // 200k ops: recursion in backward or in node destruction would overflow the stack.
  const int64_t before = cpu_allocator_stats().allocated_bytes;
  {
    Tensor x = Tensor::ones(Shape{1}, DType::F64).set_requires_grad();
    Tensor y = x;
    for (int i = 0; i < 200000; ++i) y = y * 1.0;
    Tensor unused_chain = x;
    for (int i = 0; i < 200000; ++i) unused_chain = unused_chain + 0.0;  // destroyed without backward
    sum(y).backward();
    EXPECT_EQ(x.grad().item(), 1.0);
  }
  EXPECT_EQ(cpu_allocator_stats().allocated_bytes, before) << "graph memory was not released";
}

TEST(Autograd, GradientsFlowThroughViewsAndConversions) {
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6}, Shape{3, 2}, DType::F64).set_requires_grad();
  Tensor y = sum(x.slice(1, 3).reshape(Shape{4}).to(DType::F32) * 2.0);
  y.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 2, 2, 2, 2}));
  EXPECT_EQ(x.grad().dtype(), DType::F64);
}

TEST(Autograd, OnlyInputsThatNeedGradGetThem) {
  Tensor w = Tensor::ones(Shape{3, 2}, DType::F64).set_requires_grad();
  Tensor data = Tensor::ones(Shape{4, 3}, DType::F64);
  sum(matmul(data, w)).backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(data.requires_grad());
  EXPECT_EQ(w.grad().to_vector(), std::vector<double>(6, 4.0));
}

// The engine reuses a gradient's memory only where nothing else can see it: the caller's gradient and a
// gradient one op hands to two inputs stay as they were; handed over by move it may become .grad.
TEST(Autograd, ReusesAGradientsMemoryOnlyWhereNothingElseHoldsIt) {
  Tensor x = Tensor::from_vector({1, 2, 3}, Shape{3}).set_requires_grad();
  const Tensor up = Tensor::from_vector({1, 10, 100}, Shape{3});
  Tensor y = add(x, x);  // add's backward hands the same gradient to both inputs
  y.backward(up);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, 20, 200}));
  EXPECT_EQ(up.to_vector(), (std::vector<double>{1, 10, 100}));
  EXPECT_FALSE(x.grad().shares_storage_with(up));
  // Two paths into one input, the second added into the first: the sum of both.
  Tensor z = Tensor::from_vector({1, 2, 3}, Shape{3}).set_requires_grad();
  Tensor w = add(mul(z, 2.0), mul(relu(z), 3.0));
  Tensor g = Tensor::ones(Shape{3});
  run_backward(w, std::move(g), false);
  EXPECT_EQ(z.grad().to_vector(), (std::vector<double>{5, 5, 5}));
  // Kept with retain_graph, a second backward adds again into the same .grad.
  Tensor v = mul(x, 3.0);
  x.zero_grad();
  v.backward(Tensor::ones(Shape{3}), /*retain_graph=*/true);
  v.backward(Tensor::ones(Shape{3}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{6, 6, 6}));
}

}  // namespace
}  // namespace ringtrain

// ---- WeightCastScope (core/autocast.h): a step's micro-batches and recomputations share one cast

namespace ringtrain {
namespace {

std::vector<double> bits_exact(const Tensor& t) { return t.to(DType::F64).to_vector(); }

// Two micro-batches' forward and backward through conv2d and linear under bf16 autocast, gradients
// accumulated in the weights; with a scope, each weight is cast once and the gradients are the same.
TEST(WeightCastScope, MicroBatchesShareOneCastAndGiveTheSameGradients) {
  const Tensor w0 = Tensor::uniform(Shape{8, 3, 3, 4}, -1, 1, 61), l0 = Tensor::uniform(Shape{5, 8}, -1, 1, 62);
  const Tensor b0 = Tensor::uniform(Shape{5}, -1, 1, 63);
  const Tensor x[] = {Tensor::uniform(Shape{2, 6, 6, 4}, -1, 1, 64), Tensor::uniform(Shape{2, 6, 6, 4}, -1, 1, 65)};
  auto run = [&](bool scoped, int64_t* casts, int64_t* reuses) {
    Tensor w = w0.clone().set_requires_grad(), l = l0.clone().set_requires_grad(), b = b0.clone().set_requires_grad();
    std::optional<WeightCastScope> scope;
    if (scoped) scope.emplace();
    for (const Tensor& xk : x) {
      Tensor loss;
      {
        AutocastGuard autocast(DType::BF16);
        Tensor h = mean(conv2d(xk, w, Tensor(), {.pad_h = 1, .pad_w = 1}), 1);  // (2, 6, 8)
        loss = sum(linear(mean(h, 1), l, b).to(DType::F32));
      }
      loss.backward();
    }
    if (scope) *casts = scope->casts(), *reuses = scope->reuses();
    return std::vector<std::vector<double>>{bits_exact(w.grad()), bits_exact(l.grad()), bits_exact(b.grad())};
  };
  int64_t casts = 0, reuses = 0;
  const auto plain = run(false, nullptr, nullptr), shared = run(true, &casts, &reuses);
  EXPECT_EQ(casts, 3) << "conv weight, linear weight and bias, once each";
  EXPECT_EQ(reuses, 3) << "the second micro-batch's uses";
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(shared[i], plain[i]) << "gradient " << i;
}

// Activations (no grad, or computed: not leaves) are cast as before, never kept.
TEST(WeightCastScope, OnlyWeightsAreCached) {
  WeightCastScope scope;
  AutocastGuard autocast(DType::BF16);
  Tensor w = Tensor::uniform(Shape{4, 4}, -1, 1, 66).set_requires_grad();
  Tensor computed = mul(w, 2.0);
  matmul(Tensor::uniform(Shape{3, 4}, -1, 1, 67), computed);
  EXPECT_EQ(scope.casts(), 0);
  matmul(Tensor::uniform(Shape{3, 4}, -1, 1, 68), w);
  matmul(computed, w);
  EXPECT_EQ(scope.casts(), 1);
  EXPECT_EQ(scope.reuses(), 1);
}

// A cast made under no_grad (a recomputed block's first forward) carries its gradient node, so the
// block's recomputation under grad reuses it and the weight still gets its gradient.
TEST(WeightCastScope, ACastUnderNoGradServesTheRecomputation) {
  const Tensor w0 = Tensor::uniform(Shape{4, 6}, -1, 1, 69), x = Tensor::uniform(Shape{3, 4}, -1, 1, 70);
  auto grad_of = [&](bool scoped) {
    Tensor w = w0.clone().set_requires_grad();
    std::optional<WeightCastScope> scope;
    if (scoped) scope.emplace();
    AutocastGuard autocast(DType::BF16);
    {
      NoGradGuard no_grad;
      matmul(x, w);
    }
    sum(matmul(x, w).to(DType::F32)).backward();
    if (scope) {
      EXPECT_EQ(scope->casts(), 1);
      EXPECT_EQ(scope->reuses(), 1);
    }
    return bits_exact(w.grad());
  };
  EXPECT_EQ(grad_of(true), grad_of(false));
}

// A new scope casts again: a weight changed between steps is seen.
TEST(WeightCastScope, EachScopeCastsAfresh) {
  Tensor w = Tensor::ones(Shape{2, 2}).set_requires_grad();
  const Tensor x = Tensor::ones(Shape{1, 2});
  AutocastGuard autocast(DType::BF16);
  for (double value : {1.0, 3.0}) {
    {
      NoGradGuard no_grad;
      w.fill_(value);
    }
    WeightCastScope scope;
    EXPECT_EQ(matmul(x, w).to(DType::F32).to_vector(), std::vector<double>(2, 2 * value));
  }
}

}  // namespace
}  // namespace ringtrain
