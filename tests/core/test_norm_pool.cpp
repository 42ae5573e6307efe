// Batch norm (training, eval, fused ReLU, running statistics) and pooling against PyTorch dumps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/ops.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;
using testing::load_golden;

TEST(BatchNorm, TrainingMatchesPyTorchIncludingRunningStatistics) {
  auto g = load_golden("norm_pool");
  for (DType dtype : {DType::F64, DType::F32}) {
    const DType pd = dtype == DType::F64 ? DType::F64 : DType::F32;
    const double tol = dtype == DType::F64 ? 1e-12 : 1e-4;
    Tensor x = g.at("bn_x").to(dtype).detach().set_requires_grad();
    Tensor w = g.at("bn_weight").to(pd).detach().set_requires_grad();
    Tensor b = g.at("bn_bias").to(pd).detach().set_requires_grad();
    Tensor rm = g.at("bn_running_mean_before").to(pd).detach().clone();
    Tensor rv = g.at("bn_running_var_before").to(pd).detach().clone();
    Tensor y = batch_norm(x, w, b, rm, rv, /*training=*/true, g.meta.at("momentum"), g.meta.at("eps"));
    EXPECT_TRUE(all_close(y, g.at("bn_y"), tol, tol)) << dtype_name(dtype);
    EXPECT_TRUE(all_close(rm, g.at("bn_running_mean_after"), tol, tol));
    EXPECT_TRUE(all_close(rv, g.at("bn_running_var_after"), tol, tol));
    y.backward(g.at("bn_upstream").to(dtype));
    EXPECT_TRUE(all_close(x.grad(), g.at("bn_grad_x"), tol, tol)) << dtype_name(dtype);
    EXPECT_TRUE(all_close(w.grad(), g.at("bn_grad_weight"), tol, tol));
    EXPECT_TRUE(all_close(b.grad(), g.at("bn_grad_bias"), tol, tol));
  }
}

// The f32 kernels run per-ISA clones (AVX-512, AVX2, baseline); each must give the bits of the scalar
// formula written out here: statistics in f64 over blocks of 256 rows combined in order, then f32.
TEST(BatchNorm, F32KernelsGiveTheBitsOfTheScalarFormulaOnEveryCpu) {
  const int64_t M = 600, C = 20;  // rows cross the 256-row blocks; 20 channels leave vector tails
  const double eps = 1e-5;
  std::vector<float> xv(static_cast<size_t>(M * C)), dyv(xv.size()), gv(static_cast<size_t>(C)), bv(gv.size());
  uint32_t state = 7;
  auto next = [&] { return static_cast<float>((state = state * 1664525u + 1013904223u) >> 8) / 16777216.0f; };
  for (auto& v : xv) v = 3.0f * next() - 1.0f;
  for (auto& v : dyv) v = next() - 0.5f;
  for (auto& v : gv) v = 0.5f + next();
  for (auto& v : bv) v = next() - 0.5f;
  auto f32 = [](const std::vector<float>& v, Shape shape) {  // exact: every float is a double
    return Tensor::from_vector(std::vector<double>(v.begin(), v.end()), shape);
  };
  Tensor x = f32(xv, Shape{M, C}).set_requires_grad();
  Tensor w = f32(gv, Shape{C}).set_requires_grad();
  Tensor b = f32(bv, Shape{C}).set_requires_grad();
  Tensor rm = Tensor::zeros(Shape{C}), rv = Tensor::ones(Shape{C});
  Tensor y = batch_norm(x, w, b, rm, rv, /*training=*/true, 0.1, eps);
  y.backward(f32(dyv, Shape{M, C}));

  auto blocked = [&](auto&& term) {  // per channel: sum over 256-row blocks, each from zero, in order
    std::vector<double> total(static_cast<size_t>(C), 0.0);
    for (int64_t b0 = 0; b0 < M; b0 += 256) {
      std::vector<double> acc(static_cast<size_t>(C), 0.0);
      for (int64_t r = b0; r < std::min(M, b0 + 256); ++r)
        for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(c)] += term(r, c);
      for (int64_t c = 0; c < C; ++c) total[static_cast<size_t>(c)] += acc[static_cast<size_t>(c)];
    }
    return total;
  };
  auto at = [&](const std::vector<float>& v, int64_t r, int64_t c) { return v[static_cast<size_t>(r * C + c)]; };
  std::vector<double> mean = blocked([&](int64_t r, int64_t c) { return static_cast<double>(at(xv, r, c)); });
  for (double& m : mean) m /= static_cast<double>(M);
  const std::vector<double> m2 = blocked([&](int64_t r, int64_t c) {
    const double d = static_cast<double>(at(xv, r, c)) - mean[static_cast<size_t>(c)];
    return d * d;
  });
  std::vector<float> mf(static_cast<size_t>(C)), inv(static_cast<size_t>(C));
  for (size_t c = 0; c < mf.size(); ++c) {
    mf[c] = static_cast<float>(mean[c]);
    inv[c] = static_cast<float>(1.0 / std::sqrt(m2[c] / static_cast<double>(M) + eps));
  }
  const std::vector<double> sum_dy = blocked([&](int64_t r, int64_t c) { return static_cast<double>(at(dyv, r, c)); });
  const std::vector<double> sum_dy_xhat = blocked([&](int64_t r, int64_t c) {
    const size_t k = static_cast<size_t>(c);
    return static_cast<double>(at(dyv, r, c)) *
           ((static_cast<double>(at(xv, r, c)) - static_cast<double>(mf[k])) * static_cast<double>(inv[k]));
  });
  const std::vector<double> yo = y.to_vector(), dx = x.grad().to_vector(), dw = w.grad().to_vector(),
                            db = b.grad().to_vector();
  for (int64_t c = 0; c < C; ++c) {
    const size_t k = static_cast<size_t>(c);
    const float scale = gv[k] * inv[k], shift = bv[k] - mf[k] * gv[k] * inv[k];
    const double gi = static_cast<double>(gv[k]) * inv[k];
    const float k1 = static_cast<float>(gi), k2 = static_cast<float>(gi * sum_dy[k] / static_cast<double>(M)),
                k3 = static_cast<float>(gi * sum_dy_xhat[k] / static_cast<double>(M));
    ASSERT_EQ(static_cast<float>(dw[k]), static_cast<float>(sum_dy_xhat[k])) << "dgamma, channel " << c;
    ASSERT_EQ(static_cast<float>(db[k]), static_cast<float>(sum_dy[k])) << "dbeta, channel " << c;
    for (int64_t r = 0; r < M; ++r) {
      const size_t i = static_cast<size_t>(r * C + c);
      ASSERT_EQ(static_cast<float>(yo[i]), at(xv, r, c) * scale + shift) << "y at " << r << "," << c;
      const float xhat = (at(xv, r, c) - mf[k]) * inv[k];
      ASSERT_EQ(static_cast<float>(dx[i]), at(dyv, r, c) * k1 - k2 - xhat * k3) << "dx at " << r << "," << c;
    }
  }
}

TEST(BatchNorm, EvalWithFusedReluMatchesPyTorch) {
  auto g = load_golden("norm_pool");
  Tensor x = g.at("bn_x").detach().clone().set_requires_grad();
  Tensor w = g.at("bn_weight").detach().clone().set_requires_grad();
  Tensor b = g.at("bn_bias").detach().clone().set_requires_grad();
  // PyTorch ran eval after the training step, so it used the updated running statistics.
  Tensor rm = g.at("bn_running_mean_after").clone(), rv = g.at("bn_running_var_after").clone();
  Tensor y = batch_norm(x, w, b, rm, rv, /*training=*/false, 0.1, 1e-5, /*fuse_relu=*/true);
  EXPECT_TRUE(all_close(y, g.at("bn_eval_relu_y"), 1e-12, 1e-12));
  EXPECT_EQ(rm.to_vector(), g.at("bn_running_mean_after").to_vector()) << "eval leaves statistics alone";
  y.backward(g.at("bn_upstream"));
  EXPECT_TRUE(all_close(x.grad(), g.at("bn_eval_relu_grad_x"), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(w.grad(), g.at("bn_eval_relu_grad_weight"), 1e-12, 1e-12));
}

TEST(BatchNorm, Bf16ActivationsWithF32ParametersAndErrors) {
  Tensor x = Tensor::normal(Shape{4, 3, 3, 8}, 2, 3, 1);
  Tensor w = Tensor::ones(Shape{8}), b = Tensor::zeros(Shape{8});
  Tensor rm = Tensor::zeros(Shape{8}), rv = Tensor::ones(Shape{8});
  Tensor y32 = batch_norm(x, w, b, rm.clone(), rv.clone(), true, 0.1, 1e-5);
  Tensor y16 = batch_norm(x.to(DType::BF16), w, b, rm.clone(), rv.clone(), true, 0.1, 1e-5);
  EXPECT_EQ(y16.dtype(), DType::BF16);
  EXPECT_TRUE(all_close(y16.to(DType::F32), y32, 2e-2, 2e-2));
  try {
    batch_norm(x, Tensor::ones(Shape{7}), b, rm, rv, true, 0.1, 1e-5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32[8]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(batch_norm(Tensor::ones(Shape{1, 1, 1, 8}), w, b, rm, rv, true, 0.1, 1e-5), Error);
  // The fused residual must match the input; the fused result equals the unfused composition.
  EXPECT_THROW(batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, true, Tensor::zeros(Shape{4, 3, 3, 7})), Error);
  Tensor res = Tensor::normal(x.shape(), 0, 1, 2);
  Tensor fused = batch_norm(x, w, b, rm.clone(), rv.clone(), true, 0.1, 1e-5, true, res);
  Tensor plain = relu(add(batch_norm(x, w, b, rm.clone(), rv.clone(), true, 0.1, 1e-5), res));
  EXPECT_TRUE(all_close(fused, plain, 1e-6, 1e-6));
}

// BN + ReLU without a residual: the backward recomputes the ReLU's mask from x (no masking pass). Its
// gradients are the unfused composition's, relu(batch_norm(x)), bit for bit: training and eval, f32 and
// f64, with a channel whose outputs are exactly zero and a NaN input.
void expect_same_bits(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_TRUE(std::memcmp(&a[i], &b[i], sizeof(double)) == 0) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
}

TEST(BatchNorm, FusedReluBackwardIsTheComposedReluBitForBit) {
  // bf16 (the CPU's bf16 loops): the mask is the forward's rounded output > 0, as relu's gradient reads it.
  for (DType dtype : {DType::F32, DType::F64, DType::BF16})
    for (bool training : {true, false}) {
      const DType params = dtype == DType::BF16 ? DType::F32 : dtype;
      Tensor x0 = Tensor::normal(Shape{5, 4, 3, 21}, 0.5, 2.0, 41, DType::F64).to(dtype);
      std::vector<double> xv = x0.to_vector();
      for (int64_t r = 0; r < 5 * 4 * 3; ++r) xv[static_cast<size_t>(r * 21 + 3)] = 1.25;  // channel 3 constant
      xv[7 * 21 + 5] = std::nan("");  // one NaN: its channel's statistics are NaN too
      x0 = Tensor::from_vector(xv, x0.shape(), dtype);
      const Tensor up = Tensor::normal(x0.shape(), 0, 1, 42, DType::F64).to(dtype);
      std::vector<double> bv = Tensor::uniform(Shape{21}, -1, 1, 44, DType::F64).to_vector();
      // Channel 3 normalises to exactly 0 (x = its mean, weight 1, bias 0: x * invstd - mean * invstd), in
      // training and in eval (running mean 1.25): the mask must treat 0 as the forward did (not > 0).
      std::vector<double> wv = Tensor::uniform(Shape{21}, 0.5, 1.5, 43, DType::F64).to_vector();
      std::vector<double> mv = Tensor::normal(Shape{21}, 0, 1, 45, DType::F64).to_vector();
      bv[3] = 0.0, wv[3] = 1.0, mv[3] = 1.25;
      struct Out {
        std::vector<double> y, dx, dw, db;
      };
      auto run = [&](bool fused) {
        Tensor x = x0.clone().set_requires_grad();
        Tensor w = Tensor::from_vector(wv, Shape{21}, params).set_requires_grad();
        Tensor b = Tensor::from_vector(bv, Shape{21}, params).set_requires_grad();
        Tensor rm = Tensor::from_vector(mv, Shape{21}, params), rv = Tensor::uniform(Shape{21}, 0.5, 2, 46, params);
        Tensor y = fused ? batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5, /*fuse_relu=*/true)
                         : relu(batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5));
        y.backward(up);
        return Out{y.to_vector(), x.grad().to_vector(), w.grad().to_vector(), b.grad().to_vector()};
      };
      const Out f = run(true), c = run(false);
      const std::string what = std::string(dtype_name(dtype)) + (training ? " training" : " eval");
      // The NaN channel stays NaN through both ReLUs (as PyTorch's relu), with a gradient of 0.
      expect_same_bits(f.y, c.y, what + " y");
      expect_same_bits(f.dx, c.dx, what + " dx");
      expect_same_bits(f.dw, c.dw, what + " dweight");
      expect_same_bits(f.db, c.db, what + " dbias");
      EXPECT_EQ(c.y[3], 0.0) << what << ": channel 3 was meant to normalise to exactly 0";
    }
}

// Batch norm + add + ReLU: on the CPU in f32 the backward keeps the ReLU's mask as bits instead of the
// output (core/pack.h); every gradient, the residual's included, is the composed ops' bit for bit, and
// the NaN channel's and the exact zeros' gradients are 0 as theirs are.
TEST(BatchNorm, FusedAddReluBackwardIsTheComposedOpsBitForBit) {
  for (DType dtype : {DType::F32, DType::F64}) {
    Tensor x0 = Tensor::normal(Shape{6, 5, 4, 19}, 0.5, 2.0, 51, DType::F64).to(dtype);
    std::vector<double> xv = x0.to_vector();
    xv[9 * 19 + 4] = std::nan("");
    x0 = Tensor::from_vector(xv, x0.shape(), dtype);
    std::vector<double> rv0 = Tensor::normal(x0.shape(), 0, 1, 52, DType::F64).to_vector();
    for (size_t i = 0; i < rv0.size(); i += 7) rv0[i] = 0.0;
    const Tensor res0 = Tensor::from_vector(rv0, x0.shape(), dtype);
    const Tensor up = Tensor::normal(x0.shape(), 0, 1, 53, DType::F64).to(dtype);
    struct Out {
      std::vector<double> y, dx, dw, db, dr;
    };
    auto run = [&](bool fused) {
      Tensor x = x0.clone().set_requires_grad(), r = res0.clone().set_requires_grad();
      Tensor w = Tensor::uniform(Shape{19}, 0.5, 1.5, 54, dtype).set_requires_grad();
      Tensor b = Tensor::uniform(Shape{19}, -1, 1, 55, dtype).set_requires_grad();
      Tensor rm = Tensor::zeros(Shape{19}, dtype), rvar = Tensor::ones(Shape{19}, dtype);
      Tensor y = fused ? batch_norm(x, w, b, rm, rvar, true, 0.1, 1e-5, /*fuse_relu=*/true, r)
                       : relu(add(batch_norm(x, w, b, rm, rvar, true, 0.1, 1e-5), r));
      y.backward(up);
      return Out{y.to_vector(), x.grad().to_vector(), w.grad().to_vector(), b.grad().to_vector(), r.grad().to_vector()};
    };
    const Out f = run(true), c = run(false);
    const std::string what(dtype_name(dtype));
    expect_same_bits(f.y, c.y, what + " y");
    expect_same_bits(f.dx, c.dx, what + " dx");
    expect_same_bits(f.dw, c.dw, what + " dweight");
    expect_same_bits(f.db, c.db, what + " dbias");
    expect_same_bits(f.dr, c.dr, what + " dresidual");
  }
}

// On one replica SyncBatchNorm's split passes (stats, merge, apply; local sums, dx) are plain batch norm
// bit for bit, forward and backward, for every floating dtype, with and without the fused residual + ReLU.
TEST(BatchNorm, SyncBatchNormOnOneReplicaIsPlainBatchNormBitForBit) {
  auto exchange = std::make_shared<testing::SingleReplicaExchange>();
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16})
    for (bool fused : {false, true}) {
      const DType pd = dtype == DType::F64 ? DType::F64 : DType::F32;
      const Tensor x0 = Tensor::normal(Shape{6, 3, 5, 7}, 1e3, 2.0, 31, DType::F64).to(dtype);  // mean >> spread
      const Tensor r0 = Tensor::normal(x0.shape(), 0, 1, 32, DType::F64).to(dtype);
      const Tensor up = Tensor::normal(x0.shape(), 0, 1, 33, DType::F64).to(dtype);
      struct Out {
        Tensor y, rm, rv, dx, dw, db, dr;
      };
      auto run = [&](bool sync) {
        Tensor x = x0.clone().set_requires_grad(), res = r0.clone().set_requires_grad();
        Tensor w = Tensor::uniform(Shape{7}, 0.5, 1.5, 34, pd).set_requires_grad();
        Tensor b = Tensor::uniform(Shape{7}, -1, 1, 35, pd).set_requires_grad();
        Out o{Tensor(), Tensor::zeros(Shape{7}, pd), Tensor::ones(Shape{7}, pd), {}, {}, {}, {}};
        const Tensor rres = fused ? res : Tensor();
        o.y = sync ? sync_batch_norm(x, w, b, o.rm, o.rv, 0.1, 1e-5, fused, rres, exchange)
                   : batch_norm(x, w, b, o.rm, o.rv, true, 0.1, 1e-5, fused, rres);
        o.y.backward(up);
        o.dx = x.grad();
        o.dw = w.grad();
        o.db = b.grad();
        if (fused) o.dr = res.grad();
        return o;
      };
      const Out a = run(false), s = run(true);
      const std::string what = std::string(dtype_name(dtype)) + (fused ? " fused" : "");
      EXPECT_EQ(s.y.to_vector(), a.y.to_vector()) << what;
      EXPECT_EQ(s.dx.to_vector(), a.dx.to_vector()) << what;
      EXPECT_EQ(s.dw.to_vector(), a.dw.to_vector()) << what;
      EXPECT_EQ(s.db.to_vector(), a.db.to_vector()) << what;
      EXPECT_EQ(s.rm.to_vector(), a.rm.to_vector()) << what;
      EXPECT_TRUE(all_close(s.rv, a.rv, 1e-6, 1e-6))
          << what << ": running_var (SyncBN's is exact, plain BN's from invstd)";
      if (fused) {
        EXPECT_EQ(s.dr.to_vector(), a.dr.to_vector()) << what;
      }
    }
}

// A replaying BatchNormTape normalises with the recorded statistics, not the input's, and leaves the
// running statistics alone; outside its scope batch norm reduces its input again.
TEST(BatchNorm, ATapeReplaysTheRecordedStatistics) {
  const Tensor w = Tensor::uniform(Shape{4}, 0.5, 1.5, 61), b = Tensor::uniform(Shape{4}, -1, 1, 62);
  const Tensor x = Tensor::normal(Shape{3, 5, 2, 4}, 1, 2, 63), other = Tensor::normal(x.shape(), -3, 0.5, 64);
  Tensor rm = Tensor::zeros(Shape{4}), rv = Tensor::ones(Shape{4});
  BatchNormTape tape;
  Tensor recorded;
  {
    BatchNormTape::Scope record(tape, BatchNormTape::Mode::kRecord);
    recorded = batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, true);
  }
  ASSERT_EQ(tape.size(), 1u);
  const std::vector<double> rm1 = rm.to_vector(), rv1 = rv.to_vector();
  Tensor replayed;
  {
    BatchNormTape::Scope replay(tape, BatchNormTape::Mode::kReplay);
    replayed = batch_norm(other, w, b, rm, rv, true, 0.1, 1e-5, true);
    EXPECT_EQ(tape.replayed(), 1u);
    const std::string e = testing::error_of([&] { batch_norm(other, w, b, rm, rv, true, 0.1, 1e-5); });
    EXPECT_NE(e.find("the recompute ran batch norm 2 but the forward it repeats ran 1"), std::string::npos) << e;
  }
  EXPECT_EQ(rm.to_vector(), rm1);
  EXPECT_EQ(rv.to_vector(), rv1);
  // other's values with x's statistics: eval-mode batch norm with x's batch mean and (biased) variance.
  std::vector<double> mean(4, 0.0), var(4, 0.0);
  const std::vector<double> xv = x.to_vector();
  const double n = static_cast<double>(xv.size() / 4);
  for (size_t i = 0; i < xv.size(); ++i) mean[i % 4] += xv[i] / n;
  for (size_t i = 0; i < xv.size(); ++i) var[i % 4] += (xv[i] - mean[i % 4]) * (xv[i] - mean[i % 4]) / n;
  const Tensor expected = batch_norm(other, w, b, Tensor::from_vector(mean, Shape{4}),
                                     Tensor::from_vector(var, Shape{4}), false, 0.1, 1e-5, true);
  EXPECT_TRUE(all_close(replayed, expected, 1e-4, 1e-4));
  EXPECT_FALSE(all_close(batch_norm(other, w, b, rm, rv, true, 0.1, 1e-5, true), expected, 1e-2, 1e-2))
      << "other's own statistics give the same output: the test shows nothing";
  // A replaying scope starts again at the tape's first entry: x itself replayed is the recorded output.
  const std::vector<double> with_x_stats = [&] {
    BatchNormTape::Scope replay(tape, BatchNormTape::Mode::kReplay);
    return batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, true).to_vector();
  }();
  EXPECT_EQ(with_x_stats, recorded.to_vector()) << "the same input replayed is not the recorded output";
  EXPECT_EQ(tape.replayed(), 1u);
}

TEST(Pooling, MaxAndAveragePoolingMatchPyTorch) {
  auto g = load_golden("norm_pool");
  struct Case {
    std::string name;
    bool max;
    Pool2dParams p;
  };
  for (const Case& c : {Case{"maxpool3s2p1", true, {3, 3, 2, 2, 1, 1}}, Case{"maxpool2s2", true, {2, 2, 2, 2, 0, 0}},
                        Case{"avgpool3s2p1", false, {3, 3, 2, 2, 1, 1}}}) {
    for (DType dtype : {DType::F64, DType::F32}) {
      const double tol = dtype == DType::F64 ? 1e-12 : 1e-5;
      Tensor x = g.at("pool_x").to(dtype).detach().set_requires_grad();
      Tensor y = c.max ? max_pool2d(x, c.p) : avg_pool2d(x, c.p);
      EXPECT_TRUE(all_close(y, g.at(c.name + "_y"), tol, tol)) << c.name;
      y.backward(g.at(c.name + "_upstream").to(dtype));
      EXPECT_TRUE(all_close(x.grad(), g.at(c.name + "_grad_x"), tol, tol)) << c.name;
    }
  }
  EXPECT_THROW(max_pool2d(Tensor::zeros(Shape{1, 2, 2, 1}), {3, 3, 1, 1, 0, 0}), Error);
  EXPECT_THROW(max_pool2d(Tensor::zeros(Shape{1, 4, 4, 1}), {2, 2, 1, 1, 2, 2}), Error);
}

// The max pool chooses as a plain loop over each window does: the first maximum (many ties here), NaN over
// any number, -inf as a number. Outputs, and the gradients its choices route, are the reference's bit for
// bit for each floating dtype (f32's loop is vectorised across channels), for channel counts that are and
// are not a multiple of the vector width and windows that do and do not overlap the padding.
TEST(Pooling, MaxPoolChoosesTheFirstMaximumAndPropagatesNaN) {
  for (DType dtype : {DType::F32, DType::F64, DType::BF16})
    for (int64_t channels : {1, 5, 16, 21, 64})
      for (const Pool2dParams& p :
           {Pool2dParams{3, 3, 2, 2, 1, 1}, Pool2dParams{2, 2, 2, 2, 0, 0}, Pool2dParams{3, 2, 1, 2, 1, 0}}) {
        const int64_t N = 2, H = 7, W = 9, C = channels;
        const Shape shape{N, H, W, C};
        std::vector<double> xv = Tensor::uniform(shape, 0, 4, 51, DType::F64).to_vector();
        for (size_t i = 0; i < xv.size(); ++i) {
          xv[i] = std::floor(xv[i]) - 2.0;  // -2..1: ties everywhere
          if (i % 37 == 3) xv[i] = std::nan("");
          if (i % 41 == 7) xv[i] = -std::numeric_limits<double>::infinity();
        }
        // The reference: windows in order, taps row by row.
        const int64_t P = (H + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1;
        const int64_t Q = (W + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1;
        std::vector<double> want_y(static_cast<size_t>(N * P * Q * C)), up(want_y.size());
        std::vector<double> want_dx(xv.size(), 0.0);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < P; ++i)
            for (int64_t j = 0; j < Q; ++j)
              for (int64_t c = 0; c < C; ++c) {
                int64_t at = -1;
                for (int64_t r = 0; r < p.kernel_h; ++r)
                  for (int64_t q = 0; q < p.kernel_w; ++q) {
                    const int64_t h = i * p.stride_h - p.pad_h + r, w = j * p.stride_w - p.pad_w + q;
                    if (h < 0 || h >= H || w < 0 || w >= W) continue;
                    const int64_t k = ((n * H + h) * W + w) * C + c;
                    const double v = xv[static_cast<size_t>(k)];
                    if (at < 0) {
                      at = k;
                      continue;
                    }
                    const double b = xv[static_cast<size_t>(at)];
                    if (v > b || (std::isnan(v) && !std::isnan(b))) at = k;
                  }
                const auto o = static_cast<size_t>(((n * P + i) * Q + j) * C + c);
                want_y[o] = xv[static_cast<size_t>(at)];
                up[o] = static_cast<double>(o % 8 + 1);  // small integers: exact sums in every dtype
                want_dx[static_cast<size_t>(at)] += up[o];
              }
        Tensor x = Tensor::from_vector(xv, shape, DType::F64).to(dtype).detach().set_requires_grad();
        Tensor y = max_pool2d(x, p);
        y.backward(Tensor::from_vector(up, y.shape(), DType::F64).to(dtype));
        const std::string what = std::string(dtype_name(dtype)) + " C=" + std::to_string(C) + " kernel " +
                                 std::to_string(p.kernel_h) + "x" + std::to_string(p.kernel_w) + " stride " +
                                 std::to_string(p.stride_h);
        const std::vector<double> got = y.to(DType::F64).to_vector();
        ASSERT_EQ(got.size(), want_y.size()) << what;
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_TRUE(got[i] == want_y[i] || (std::isnan(got[i]) && std::isnan(want_y[i])))
              << what << " output " << i << ": " << got[i] << " against " << want_y[i];
        EXPECT_EQ(x.grad().to(DType::F64).to_vector(), want_dx) << what << ": a gradient went to another element";
      }
}

TEST(Pooling, GlobalAveragePool) {
  Tensor x = Tensor::from_vector({1, 10, 2, 20, 3, 30, 4, 40}, Shape{1, 2, 2, 2});
  EXPECT_EQ(global_avg_pool(x).to_vector(), (std::vector<double>{2.5, 25}));
  EXPECT_EQ(global_avg_pool(x).shape(), (Shape{1, 2}));
}

}  // namespace
}  // namespace ringtrain
