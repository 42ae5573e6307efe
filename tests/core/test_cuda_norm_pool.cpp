// CUDA batch norm and pooling (core/cuda/norm_pool.cu) agree with the CPU kernels, forward and backward,
// through the public ops and autograd, for f32, f64, f16 and bf16. Every test skips with the reason when
// there is no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/check.h"
#include "core/device.h"
#include "core/dispatch.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;

const Device kGpu = Device::cuda(0);
const DType kFloatingTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16};

// Forward tolerance per activation dtype (tests/test_util.h).
double tol_for(DType t) { return testing::cuda_vs_cpu_tolerance(t); }
// Backward: one more rounding chain (and the statistics' gradient terms) than forward.
double grad_tol_for(DType t) { return 10 * tol_for(t); }
// Statistics and parameter gradients are f32 (f64 for f64 inputs), summed in f64 on both devices.
double stat_tol_for(DType t) { return t == DType::F64 ? 1e-12 : 1e-5; }
DType param_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

Tensor on_cpu(const Tensor& t) { return t.to(Device::cpu()); }

// ---------------------------------------------------------------------------------------------------
// Batch norm

struct BnCase {
  std::string name;
  Shape shape;  // (N, ..., C)
  bool training = true;
  bool relu = false;
  bool residual = false;
};

void PrintTo(const BnCase& c, std::ostream* os) { *os << c.name; }

std::vector<BnCase> bn_cases() {
  return {
      {"train", Shape{4, 5, 6, 16}},
      {"train_relu", Shape{4, 5, 6, 16}, true, true},
      {"train_residual_relu", Shape{4, 5, 6, 40}, true, true, true},
      {"train_residual", Shape{2, 3, 5, 24}, true, false, true},
      {"eval", Shape{4, 5, 6, 16}, false},
      {"eval_residual_relu", Shape{3, 4, 5, 33}, false, true, true},
      {"odd_c7_odd_m", Shape{3, 5, 7, 7}},             // M = 105, C = 7: one partial tile
      {"one_channel", Shape{5, 3, 3, 1}},              // C = 1
      {"two_dims", Shape{37, 19}},                     // (N, C) input
      {"several_parts", Shape{7, 13, 17, 40}},         // M = 1547: several row parts with a ragged tail
      {"large_m", Shape{64, 28, 28, 64}, true, true},  // M = 50176: many parts per channel tile
  };
}

class CudaBatchNorm : public ::testing::TestWithParam<std::tuple<BnCase, DType>> {};

TEST_P(CudaBatchNorm, ForwardBackwardAndRunningStatisticsAgree) {
  RT_REQUIRE_CUDA();
  const auto& [c, dtype] = GetParam();
  const int64_t C = c.shape[c.shape.ndim() - 1];
  const DType pd = param_dtype(dtype);
  const Shape cs{C};
  // A mean well away from 0 exercises the two-pass variance.
  const Tensor x = Tensor::normal(c.shape, 3.0, 2.0, 11, DType::F64).to(dtype);
  const Tensor res = Tensor::normal(c.shape, 0.0, 1.0, 12, DType::F64).to(dtype);
  const Tensor w = Tensor::uniform(cs, 0.5, 1.5, 13, DType::F64).to(pd);
  const Tensor b = Tensor::uniform(cs, -0.5, 0.5, 14, DType::F64).to(pd);
  const Tensor rm = Tensor::uniform(cs, 2.0, 4.0, 15, DType::F64).to(pd);
  const Tensor rv = Tensor::uniform(cs, 2.0, 6.0, 16, DType::F64).to(pd);
  const Tensor upstream = Tensor::normal(c.shape, 0.0, 1.0, 17, DType::F64).to(dtype);
  constexpr double kMomentum = 0.1, kEps = 1e-5;

  struct Run {
    Tensor x, w, b, res, rm, rv, y;
  };
  auto run = [&](Device d) {
    Run r;
    // Fresh leaves on each device (to() onto the same device aliases, so never mark the shared inputs).
    r.x = x.to(d).clone().set_requires_grad();
    r.w = w.to(d).clone().set_requires_grad();
    r.b = b.to(d).clone().set_requires_grad();
    if (c.residual) r.res = res.to(d).clone().set_requires_grad();
    r.rm = rm.to(d).clone();
    r.rv = rv.to(d).clone();
    r.y = batch_norm(r.x, r.w, r.b, r.rm, r.rv, c.training, kMomentum, kEps, c.relu, r.res);
    r.y.backward(upstream.to(d));
    return r;
  };
  const Run cpu = run(Device::cpu());
  const Run gpu = run(kGpu);
  const std::string what = c.name + " " + std::string(dtype_name(dtype));

  ASSERT_EQ(gpu.y.device(), kGpu);
  ASSERT_EQ(gpu.y.dtype(), dtype);
  const double tol = tol_for(dtype), gtol = grad_tol_for(dtype), stol = stat_tol_for(dtype);
  EXPECT_TRUE(all_close(on_cpu(gpu.y), cpu.y, tol, tol)) << what << ": y";
  if (c.relu) {
    for (double v : gpu.y.to_vector()) ASSERT_GE(v, 0.0) << what << ": fused ReLU output";
  }
  // Running statistics: updated in training (by the op, from the kernel's saved statistics), untouched in eval.
  EXPECT_TRUE(all_close(on_cpu(gpu.rm), cpu.rm, stol, stol)) << what << ": running_mean";
  EXPECT_TRUE(all_close(on_cpu(gpu.rv), cpu.rv, stol, stol)) << what << ": running_var";
  if (!c.training) {
    EXPECT_EQ(gpu.rm.to_vector(), rm.to_vector()) << what << ": eval leaves running_mean alone";
    EXPECT_EQ(gpu.rv.to_vector(), rv.to_vector()) << what << ": eval leaves running_var alone";
  }
  EXPECT_TRUE(all_close(on_cpu(gpu.x.grad()), cpu.x.grad(), gtol, gtol)) << what << ": dx";
  // dgamma and dbeta are sums over M of 16-bit products: compare relative to their scale.
  const double ptol = dtype == DType::F64 ? 1e-10 : (dtype == DType::F32 ? 1e-4 : 1e-3);
  EXPECT_TRUE(all_close(on_cpu(gpu.w.grad()), cpu.w.grad(), ptol, ptol)) << what << ": dgamma";
  EXPECT_TRUE(all_close(on_cpu(gpu.b.grad()), cpu.b.grad(), ptol, ptol)) << what << ": dbeta";
  if (c.residual) {
    EXPECT_TRUE(all_close(on_cpu(gpu.res.grad()), cpu.res.grad(), gtol, gtol)) << what << ": dresidual";
  }
}

// SyncBatchNorm's kernels (statistics, apply, local sums, dx) on the GPU, through the op with a single
// replica, against plain batch norm on the CPU (which it equals there bit for bit).
TEST_P(CudaBatchNorm, SyncBatchNormKernelsAgreeWithTheCpu) {
  RT_REQUIRE_CUDA();
  const auto& [c, dtype] = GetParam();
  if (!c.training) GTEST_SKIP() << "SyncBatchNorm synchronises training statistics only";
  const int64_t C = c.shape[c.shape.ndim() - 1];
  const DType pd = param_dtype(dtype);
  const Tensor x = Tensor::normal(c.shape, 3.0, 2.0, 11, DType::F64).to(dtype);
  const Tensor res = Tensor::normal(c.shape, 0.0, 1.0, 12, DType::F64).to(dtype);
  const Tensor w = Tensor::uniform(Shape{C}, 0.5, 1.5, 13, DType::F64).to(pd);
  const Tensor b = Tensor::uniform(Shape{C}, -0.5, 0.5, 14, DType::F64).to(pd);
  const Tensor upstream = Tensor::normal(c.shape, 0.0, 1.0, 17, DType::F64).to(dtype);
  auto exchange = std::make_shared<testing::SingleReplicaExchange>();
  struct Run {
    Tensor x, w, b, res, rm, rv, y;
  };
  auto run = [&](Device d) {
    Run r;
    r.x = x.to(d).clone().set_requires_grad();
    r.w = w.to(d).clone().set_requires_grad();
    r.b = b.to(d).clone().set_requires_grad();
    if (c.residual) r.res = res.to(d).clone().set_requires_grad();
    r.rm = Tensor::zeros(Shape{C}, pd, d);
    r.rv = Tensor::ones(Shape{C}, pd, d);
    r.y = d.is_cpu() ? batch_norm(r.x, r.w, r.b, r.rm, r.rv, true, 0.1, 1e-5, c.relu, r.res)
                     : sync_batch_norm(r.x, r.w, r.b, r.rm, r.rv, 0.1, 1e-5, c.relu, r.res, exchange);
    r.y.backward(upstream.to(d));
    return r;
  };
  const Run cpu = run(Device::cpu()), gpu = run(kGpu);
  const std::string what = c.name + " " + std::string(dtype_name(dtype));
  const double tol = tol_for(dtype), gtol = grad_tol_for(dtype), stol = stat_tol_for(dtype);
  const double ptol = dtype == DType::F64 ? 1e-10 : (dtype == DType::F32 ? 1e-4 : 1e-3);
  EXPECT_TRUE(all_close(on_cpu(gpu.y), cpu.y, tol, tol)) << what << ": y";
  EXPECT_TRUE(all_close(on_cpu(gpu.rm), cpu.rm, stol, stol)) << what << ": running_mean";
  EXPECT_TRUE(all_close(on_cpu(gpu.rv), cpu.rv, stol, stol)) << what << ": running_var";
  EXPECT_TRUE(all_close(on_cpu(gpu.x.grad()), cpu.x.grad(), gtol, gtol)) << what << ": dx";
  EXPECT_TRUE(all_close(on_cpu(gpu.w.grad()), cpu.w.grad(), ptol, ptol)) << what << ": dgamma";
  EXPECT_TRUE(all_close(on_cpu(gpu.b.grad()), cpu.b.grad(), ptol, ptol)) << what << ": dbeta";
  if (c.residual) {
    EXPECT_TRUE(all_close(on_cpu(gpu.res.grad()), cpu.res.grad(), gtol, gtol)) << what << ": dresidual";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaBatchNorm,
                         ::testing::Combine(::testing::ValuesIn(bn_cases()), ::testing::ValuesIn(kFloatingTypes)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::string(dtype_name(std::get<1>(info.param)));
                         });

TEST(CudaBatchNormMisc, SavedStatisticsMatchTheBatchAndRunningStatisticsAfterOneStep) {
  RT_REQUIRE_CUDA();
  // Known statistics: channel c holds values with mean 1000 + c and biased variance (c + 1)^2, a large
  // mean relative to the spread (E[x^2] - E[x]^2 in f32 would lose most digits).
  const int64_t M = 4096, C = 5;
  std::vector<double> v(static_cast<size_t>(M * C));
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < C; ++c)
      v[static_cast<size_t>(r * C + c)] = 1000.0 + static_cast<double>(c) + (r % 2 ? 1.0 : -1.0) * (c + 1);
  for (DType dtype : {DType::F32, DType::F64}) {
    const DType pd = param_dtype(dtype);
    Tensor x = Tensor::from_vector(v, Shape{M, C}, dtype, kGpu);
    Tensor w = Tensor::ones(Shape{C}, pd, kGpu), b = Tensor::zeros(Shape{C}, pd, kGpu);
    Tensor rm = Tensor::zeros(Shape{C}, pd, kGpu), rv = Tensor::ones(Shape{C}, pd, kGpu);
    Tensor y = batch_norm(x, w, b, rm, rv, true, 0.5, 1e-5);
    const std::vector<double> mean = rm.to_vector(), var = rv.to_vector();
    for (int64_t c = 0; c < C; ++c) {
      const double m = 1000.0 + static_cast<double>(c), s2 = (c + 1.0) * (c + 1.0);
      EXPECT_NEAR(mean[static_cast<size_t>(c)], 0.5 * m, 1e-9 * m) << dtype_name(dtype) << " channel " << c;
      const double unbiased = s2 * static_cast<double>(M) / static_cast<double>(M - 1);
      EXPECT_NEAR(var[static_cast<size_t>(c)], 0.5 + 0.5 * unbiased, 1e-5 * unbiased)
          << dtype_name(dtype) << " channel " << c;
    }
    // Normalised output: exactly +-1 up to eps and rounding.
    for (double value : y.to_vector()) EXPECT_NEAR(std::abs(value), 1.0, 1e-4) << dtype_name(dtype);
  }
}

TEST(CudaBatchNormMisc, RepeatedRunsAreBitwiseIdentical) {
  RT_REQUIRE_CUDA();
  for (DType dtype : kFloatingTypes) {
    const DType pd = param_dtype(dtype);
    Tensor x = Tensor::normal(Shape{16, 14, 14, 96}, 1.0, 3.0, 21, dtype, kGpu).set_requires_grad();
    Tensor w = Tensor::ones(Shape{96}, pd, kGpu).set_requires_grad();
    Tensor b = Tensor::zeros(Shape{96}, pd, kGpu).set_requires_grad();
    Tensor up = Tensor::normal(x.shape(), 0, 1, 22, dtype, kGpu);
    std::vector<std::vector<double>> first;
    for (int run = 0; run < 2; ++run) {
      x.zero_grad();
      w.zero_grad();
      b.zero_grad();
      Tensor rm = Tensor::zeros(Shape{96}, pd, kGpu), rv = Tensor::ones(Shape{96}, pd, kGpu);
      Tensor y = batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, true);
      y.backward(up);
      std::vector<std::vector<double>> got = {y.to_vector(), rm.to_vector(), rv.to_vector(), x.grad().to_vector(),
                                              w.grad().to_vector()};
      if (run == 0)
        first = got;
      else
        EXPECT_EQ(got, first) << dtype_name(dtype);
    }
  }
}

void expect_same_bits(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_TRUE(std::memcmp(&a[i], &b[i], sizeof(double)) == 0) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
}

// BN + ReLU without a residual: CUDA's backward recomputes the ReLU's mask from x (no masking pass, y not
// kept), for every dtype. Its gradients are the unfused relu(batch_norm(x))'s bit for bit, through the
// vector kernels (C = 24) and the scalar ones (C = 21), with a channel that normalises to exactly 0 and a
// NaN input, in training and eval.
TEST(CudaBatchNormMisc, FusedReluBackwardIsTheComposedReluBitForBit) {
  RT_REQUIRE_CUDA();
  for (int64_t C : {int64_t{24}, int64_t{21}})
    for (DType dtype : kFloatingTypes)
      for (bool training : {true, false}) {
        const DType pd = param_dtype(dtype);
        const Shape shape{5, 4, 3, C};
        std::vector<double> xv = Tensor::normal(shape, 0.5, 2.0, 41, DType::F64).to(dtype).to_vector();
        for (int64_t r = 0; r < 5 * 4 * 3; ++r) xv[static_cast<size_t>(r * C + 3)] = 1.25;  // channel 3 constant
        xv[static_cast<size_t>(7 * C + 5)] = std::nan("");
        const Tensor x0 = Tensor::from_vector(xv, shape, dtype, kGpu);
        const Tensor up = Tensor::normal(shape, 0, 1, 42, DType::F64).to(dtype).to(kGpu);
        std::vector<double> bv = Tensor::uniform(Shape{C}, -1, 1, 44, DType::F64).to_vector();
        std::vector<double> wv = Tensor::uniform(Shape{C}, 0.5, 1.5, 43, DType::F64).to_vector();
        std::vector<double> mv = Tensor::normal(Shape{C}, 0, 1, 45, DType::F64).to_vector();
        bv[3] = 0.0, wv[3] = 1.0, mv[3] = 1.25;
        struct Out {
          std::vector<double> y, dx, dw, db;
        };
        auto run = [&](bool fused) {
          Tensor x = x0.clone().set_requires_grad();
          Tensor w = Tensor::from_vector(wv, Shape{C}, pd, kGpu).set_requires_grad();
          Tensor b = Tensor::from_vector(bv, Shape{C}, pd, kGpu).set_requires_grad();
          Tensor rm = Tensor::from_vector(mv, Shape{C}, pd, kGpu);
          Tensor rv = Tensor::uniform(Shape{C}, 0.5, 2, 46, pd, kGpu);
          Tensor y = fused ? batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5, /*fuse_relu=*/true)
                           : relu(batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5));
          y.backward(up);
          return Out{y.to_vector(), x.grad().to_vector(), w.grad().to_vector(), b.grad().to_vector()};
        };
        const Out f = run(true), c = run(false);
        const std::string what =
            std::string(dtype_name(dtype)) + " C=" + std::to_string(C) + (training ? " training" : " eval");
        // NaN stays NaN through both ReLUs (both masks are 0 there); the half conversions of the two paths
        // may canonicalise its payload differently, so a NaN on both sides counts as the same.
        std::vector<double> fy = f.y, cy = c.y;
        for (size_t i = 0; i < fy.size() && i < cy.size(); ++i)
          if (std::isnan(fy[i]) && std::isnan(cy[i])) fy[i] = cy[i] = 0.0;
        expect_same_bits(fy, cy, what + " y");
        expect_same_bits(f.dx, c.dx, what + " dx");
        expect_same_bits(f.dw, c.dw, what + " dweight");
        expect_same_bits(f.db, c.db, what + " dbias");
        EXPECT_EQ(c.y[3], 0.0) << what << ": channel 3 was meant to normalise to exactly 0";
      }
}

// The vector kernels (16-byte loads, C a multiple of 8 / 4 / 2 elements) and the scalar ones agree: the
// same input once aligned and once one element into a buffer (which the vector path refuses), forward,
// backward (BN + add + ReLU, and BN + ReLU's fused backward) and SyncBatchNorm's statistics, every float
// dtype. Element-wise results are the same bits; sums differ at most by their order (f64 accumulation).
TEST(CudaBatchNormMisc, VectorAndScalarPathsAgree) {
  RT_REQUIRE_CUDA();
  for (DType dtype : kFloatingTypes)
    for (bool with_residual : {true, false}) {
      const DType pd = param_dtype(dtype);
      const int64_t C = 64, rows = 9 * 7 * 5;
      const Tensor host = Tensor::normal(Shape{rows * C + 1}, 2.0, 3.0, 51, DType::F64).to(dtype);
      const Tensor res_host = Tensor::normal(Shape{rows * C + 1}, 0.0, 1.0, 52, DType::F64).to(dtype);
      const Tensor up_host = Tensor::normal(Shape{rows * C + 1}, 0.0, 1.0, 53, DType::F64).to(dtype);
      // slice(1, ...) of a 1-D tensor starts one element (2, 4 or 8 bytes) in: not 16-byte aligned; its
      // clone holds the same values in a fresh (aligned) block.
      auto at = [&](const Tensor& t, bool aligned) {
        const Tensor off = t.to(kGpu).slice(1, rows * C + 1);
        return (aligned ? off.clone() : off).view(Shape{9, 7, 5, C});
      };
      std::vector<std::vector<double>> got[2];
      for (int aligned = 0; aligned < 2; ++aligned) {
        const Tensor up = at(up_host, aligned != 0);
        Tensor x = at(host, aligned != 0).detach().set_requires_grad();
        Tensor res = with_residual ? at(res_host, aligned != 0).detach().set_requires_grad() : Tensor();
        Tensor w = Tensor::uniform(Shape{C}, 0.5, 1.5, 54, pd, kGpu).set_requires_grad();
        Tensor b = Tensor::uniform(Shape{C}, -0.5, 0.5, 55, pd, kGpu).set_requires_grad();
        Tensor rm = Tensor::zeros(Shape{C}, pd, kGpu), rv = Tensor::ones(Shape{C}, pd, kGpu);
        Tensor y = batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, true, res);
        y.backward(up);
        Tensor stats = Tensor::empty(Shape{2 * C + 1}, DType::F64, kGpu);
        detail::kernel_table(kGpu, "batch_norm_stats").batch_norm_stats(x, stats);
        got[aligned] = {y.to_vector(),  x.grad().to_vector(), w.grad().to_vector(), b.grad().to_vector(),
                        rm.to_vector(), rv.to_vector(),       stats.to_vector()};
        if (with_residual) got[aligned].push_back(res.grad().to_vector());
      }
      const char* names[] = {"y", "dx", "dgamma", "dbeta", "running_mean", "running_var", "stats", "dresidual"};
      for (size_t i = 0; i < got[0].size(); ++i) {
        // Bits can differ only through a sum's order: the statistics (f64, then rounded to the parameter
        // dtype) and what uses them, an ulp of the activation dtype at most.
        const bool sums = i >= 2 && i <= 6;
        const double tol = sums ? (dtype == DType::F64 ? 1e-12 : 1e-6) : tol_for(dtype);
        const auto n = static_cast<int64_t>(got[0][i].size());
        EXPECT_TRUE(
            all_close(Tensor::from_vector(got[0][i], Shape{n}), Tensor::from_vector(got[1][i], Shape{n}), tol, tol))
            << dtype_name(dtype) << (with_residual ? " residual" : " fused ReLU") << ": " << names[i];
      }
    }
}

// The running statistics' update in one kernel is the element-wise ops' arithmetic (which the CPU runs)
// bit for bit: f32 and f64 statistics, one channel with invstd near 1/sqrt(eps).
TEST(CudaBatchNormMisc, RunningStatisticsUpdateIsTheComposedOpsBitForBit) {
  RT_REQUIRE_CUDA();
  const auto update = detail::kernel_table(kGpu, "batch_norm").batch_norm_update_running;
  ASSERT_NE(update, nullptr) << "CUDA registers batch_norm_update_running";
  for (DType pd : {DType::F32, DType::F64}) {
    const int64_t C = 77;
    constexpr double kMomentum = 0.1, kEps = 1e-5;
    const double var_weight = kMomentum * 1000.0 / 999.0;
    const Tensor mean = Tensor::normal(Shape{C}, 0, 3, 81, pd);
    std::vector<double> iv = Tensor::uniform(Shape{C}, 0.05, 20, 82, DType::F64).to_vector();
    iv[5] = 1.0 / std::sqrt(kEps) * 0.999;  // variance near 0: 1 / invstd^2 - eps cancels
    const Tensor invstd = Tensor::from_vector(iv, Shape{C}, pd);
    const Tensor rm = Tensor::normal(Shape{C}, 0, 1, 83, pd), rv = Tensor::uniform(Shape{C}, 0.5, 4, 84, pd);
    // The composed ops on the CPU, as ops.cpp runs them where no kernel is registered.
    const Tensor var = add(rdiv(mul(invstd, invstd), 1.0), -kEps);
    const Tensor want_rm = add(mul(rm, 1.0 - kMomentum), mul(mean, kMomentum));
    const Tensor want_rv = add(mul(rv, 1.0 - kMomentum), mul(var, var_weight));
    Tensor grm = rm.to(kGpu).clone(), grv = rv.to(kGpu).clone();
    update(mean.to(kGpu), invstd.to(kGpu), kEps, kMomentum, var_weight, grm, grv);
    expect_same_bits(grm.to_vector(), want_rm.to_vector(), std::string(dtype_name(pd)) + " running_mean");
    expect_same_bits(grv.to_vector(), want_rv.to_vector(), std::string(dtype_name(pd)) + " running_var");
  }
}

TEST(CudaBatchNormMisc, KernelsRejectNonFloatingDtypesNamingOpAndDtype) {
  RT_REQUIRE_CUDA();
  // The ops reject integer inputs before reaching a kernel; call the CUDA kernels directly.
  const KernelTable* table = cuda_kernels();
  ASSERT_NE(table, nullptr);
  Tensor x = Tensor::zeros(Shape{1, 4, 4, 3}, DType::I32, kGpu);
  Tensor p = Tensor::ones(Shape{3}, DType::F32, kGpu);
  Tensor y = Tensor::empty(x.shape(), DType::I32, kGpu);
  Tensor mean = Tensor::empty(Shape{3}, DType::F32, kGpu), invstd = Tensor::empty(Shape{3}, DType::F32, kGpu);
  std::string message =
      testing::error_of([&] { table->batch_norm_forward(x, p, p, p, p, true, 1e-5, false, nullptr, y, mean, invstd); });
  EXPECT_NE(message.find("batch_norm"), std::string::npos) << message;
  EXPECT_NE(message.find("i32"), std::string::npos) << message;
  ConvGeometry g;
  g.n = 1;
  g.h = g.w = 4;
  g.c = g.k = 3;
  g.r = g.s = 2;
  g.stride_h = g.stride_w = 2;
  g.p = g.q = 2;
  Tensor py = Tensor::empty(Shape{1, 2, 2, 3}, DType::I32, kGpu);
  Tensor argmax = Tensor::empty(Shape{1, 2, 2, 3}, DType::I64, kGpu);
  message = testing::error_of([&] { table->max_pool2d_forward(x, g, py, argmax); });
  EXPECT_NE(message.find("max_pool2d"), std::string::npos) << message;
  EXPECT_NE(message.find("i32"), std::string::npos) << message;
  message = testing::error_of([&] { table->avg_pool2d_backward(py, g, y); });
  EXPECT_NE(message.find("avg_pool2d_backward"), std::string::npos) << message;
  EXPECT_NE(message.find("i32"), std::string::npos) << message;
}

// ---------------------------------------------------------------------------------------------------
// Pooling

enum class PoolKind { Max, Avg, Global };

struct PoolCase {
  std::string name;
  PoolKind kind;
  Shape shape;  // (N, H, W, C)
  Pool2dParams params = {};
  // Inputs drawn from {0, 1, 2} (many ties inside a window) instead of a continuous distribution.
  bool ties = false;
};

void PrintTo(const PoolCase& c, std::ostream* os) { *os << c.name; }

std::vector<PoolCase> pool_cases() {
  return {
      {"max3s2p1_stem", PoolKind::Max, Shape{2, 16, 16, 64}, {3, 3, 2, 2, 1, 1}},
      {"max3s2p1_odd", PoolKind::Max, Shape{2, 9, 11, 5}, {3, 3, 2, 2, 1, 1}},
      {"max3s2p1_ties", PoolKind::Max, Shape{2, 9, 9, 6}, {3, 3, 2, 2, 1, 1}, true},
      {"max3s1p1_overlap_ties", PoolKind::Max, Shape{2, 7, 6, 3}, {3, 3, 1, 1, 1, 1}, true},
      {"max2s2", PoolKind::Max, Shape{3, 8, 8, 16}, {2, 2, 2, 2, 0, 0}},
      {"max2s2_odd", PoolKind::Max, Shape{3, 7, 9, 5}, {2, 2, 2, 2, 0, 0}},
      {"max2s2_ties", PoolKind::Max, Shape{2, 6, 6, 4}, {2, 2, 2, 2, 0, 0}, true},
      {"max1s2_gaps", PoolKind::Max, Shape{1, 5, 5, 3}, {1, 1, 2, 2, 0, 0}},
      {"avg2s2", PoolKind::Avg, Shape{3, 8, 8, 16}, {2, 2, 2, 2, 0, 0}},
      {"avg2s2_odd", PoolKind::Avg, Shape{2, 7, 5, 9}, {2, 2, 2, 2, 0, 0}},
      {"avg3s2p1", PoolKind::Avg, Shape{2, 9, 9, 7}, {3, 3, 2, 2, 1, 1}},
      {"avg3s1p1", PoolKind::Avg, Shape{2, 6, 7, 33}, {3, 3, 1, 1, 1, 1}},
      {"avg3x2s2p1", PoolKind::Avg, Shape{1, 8, 7, 4}, {3, 2, 2, 1, 1, 1}},
      {"global_resnet", PoolKind::Global, Shape{4, 7, 7, 256}},
      {"global_odd", PoolKind::Global, Shape{3, 5, 3, 7}},
  };
}

Tensor apply_pool(const PoolCase& c, const Tensor& x) {
  switch (c.kind) {
    case PoolKind::Max:
      return max_pool2d(x, c.params);
    case PoolKind::Avg:
      return avg_pool2d(x, c.params);
    case PoolKind::Global:
      return global_avg_pool(x);
  }
  return Tensor();
}

class CudaPool : public ::testing::TestWithParam<std::tuple<PoolCase, DType>> {};

TEST_P(CudaPool, ForwardAndBackwardAgree) {
  RT_REQUIRE_CUDA();
  const auto& [c, dtype] = GetParam();
  Tensor x = Tensor::uniform(c.shape, -2.0, 2.0, 31, DType::F64).to(dtype);
  if (c.ties) {
    std::vector<double> v = Tensor::uniform(c.shape, 0.0, 3.0, 31, DType::F64).to_vector();
    for (double& e : v) e = std::floor(e);
    x = Tensor::from_vector(v, c.shape, dtype);
  }
  const Tensor xc = x.clone().set_requires_grad(), xg = x.to(kGpu).set_requires_grad();
  const Tensor yc = apply_pool(c, xc), yg = apply_pool(c, xg);
  const std::string what = c.name + " " + std::string(dtype_name(dtype));
  ASSERT_EQ(yg.device(), kGpu);
  ASSERT_EQ(yg.shape(), yc.shape()) << what;
  const double tol = tol_for(dtype);
  if (c.kind == PoolKind::Max) {
    EXPECT_EQ(yg.to_vector(), yc.to_vector()) << what << ": a maximum is an input value";
  } else {
    EXPECT_TRUE(all_close(on_cpu(yg), yc, tol, tol)) << what;
  }
  const Tensor up = Tensor::uniform(yc.shape(), 0.5, 1.5, 32, DType::F64).to(dtype);
  yc.backward(up);
  yg.backward(up.to(kGpu));
  // Max: the gradient goes to the first maximum of each window; with ties a different choice would move
  // a whole upstream value, far outside the tolerance.
  EXPECT_TRUE(all_close(on_cpu(xg.grad()), xc.grad(), grad_tol_for(dtype), grad_tol_for(dtype))) << what << ": dx";
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaPool,
                         ::testing::Combine(::testing::ValuesIn(pool_cases()), ::testing::ValuesIn(kFloatingTypes)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::string(dtype_name(std::get<1>(info.param)));
                         });

TEST(CudaPoolMisc, MaxPoolWithInfinitiesAndNaN) {
  RT_REQUIRE_CUDA();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // (1, 4, 4, 2): channel 0 all -inf (every window's maximum is -inf: the first in-bounds element wins),
  // channel 1 mixes -inf, +inf, NaN and ties.
  std::vector<double> v(32, -inf);
  const double ch1[16] = {-inf, -inf, 1, 1, -inf, 2, 2, inf, 0, nan, -inf, -inf, 3, 3, -inf, -1};
  for (int i = 0; i < 16; ++i) v[static_cast<size_t>(2 * i + 1)] = ch1[i];
  for (DType dtype : kFloatingTypes) {
    for (const Pool2dParams& p :
         {Pool2dParams{3, 3, 2, 2, 1, 1}, Pool2dParams{2, 2, 2, 2, 0, 0}, Pool2dParams{3, 3, 1, 1, 1, 1}}) {
      const Tensor x = Tensor::from_vector(v, Shape{1, 4, 4, 2}, dtype);
      const Tensor xc = x.clone().set_requires_grad(), xg = x.to(kGpu).set_requires_grad();
      const Tensor yc = max_pool2d(xc, p), yg = max_pool2d(xg, p);
      const std::string what = std::string(dtype_name(dtype)) + " kernel " + std::to_string(p.kernel_h) + " stride " +
                               std::to_string(p.stride_h);
      // all_close: NaN and infinities must sit at the same places and be equal.
      EXPECT_TRUE(all_close(on_cpu(yg), yc, 0, 0)) << what;
      const Tensor up = Tensor::uniform(yc.shape(), 0.5, 1.5, 41, DType::F64).to(dtype);
      yc.backward(up);
      yg.backward(up.to(kGpu));
      EXPECT_TRUE(all_close(on_cpu(xg.grad()), xc.grad(), grad_tol_for(dtype), grad_tol_for(dtype))) << what;
    }
  }
}

TEST(CudaPoolMisc, AveragePoolCountsPaddingAndIsExactOnSmallIntegers) {
  RT_REQUIRE_CUDA();
  // Ones with padding: corners see 4 of 9 elements (count_include_pad divides by 9).
  for (DType dtype : kFloatingTypes) {
    Tensor y = avg_pool2d(Tensor::ones(Shape{1, 4, 4, 3}, dtype, kGpu), {3, 3, 2, 2, 1, 1});
    ASSERT_EQ(y.shape(), (Shape{1, 2, 2, 3}));
    const std::vector<double> got = y.to_vector();
    const std::vector<double> expected = {4.0 / 9, 4.0 / 9, 4.0 / 9, 6.0 / 9, 6.0 / 9, 6.0 / 9,
                                          6.0 / 9, 6.0 / 9, 6.0 / 9, 1.0,     1.0,     1.0};
    EXPECT_TRUE(all_close(got, expected, tol_for(dtype), tol_for(dtype))) << dtype_name(dtype);
  }
}

TEST(CudaPoolMisc, GlobalAveragePoolValues) {
  RT_REQUIRE_CUDA();
  Tensor x = Tensor::from_vector({1, 10, 2, 20, 3, 30, 4, 40}, Shape{1, 2, 2, 2}, DType::F32, kGpu);
  Tensor y = global_avg_pool(x);
  EXPECT_EQ(y.device(), kGpu);
  EXPECT_EQ(y.shape(), (Shape{1, 2}));
  EXPECT_EQ(y.to_vector(), (std::vector<double>{2.5, 25}));
}

}  // namespace
}  // namespace ringtrain
