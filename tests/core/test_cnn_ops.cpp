// The pieces of today's CNNs (core/ops.h: cat ... cross_entropy over pixels): PyTorch 2.15's values and
// gradients (tests/golden/cnn_ops.json, scripts/make_goldens.py) in f64 (tight), f32 and bf16 (the vectorized
// CPU paths, loose); what each op does with odd sizes, one-element dims and views; and every bad input refused
// naming the op and the shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/autograd.h"
#include "core/ops.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;
using testing::error_of;
using testing::load_golden;
using testing::random_f64;

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Tolerance {
  double rtol, atol;
};
Tolerance tolerance(DType t) {
  switch (t) {
    case DType::F64:
      return {1e-10, 1e-12};
    case DType::F32:
      return {2e-5, 2e-5};
    default:
      return {3e-2, 3e-2};
  }
}

// Runs `fn` on the golden's inputs NAME_in0.. in dtype, backpropagates NAME_upstream and compares the output
// and every gradient the golden has. `grad_inputs`: how many inputs are floating leaves (the rest: labels).
void check_golden(const testing::Golden& g, const std::string& name, size_t inputs, const OpFn& fn, DType dtype,
                  double scale = 1.0, double rtol_floor = 0.0) {
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < inputs; ++i)
    leaves.push_back(g.at(name + "_in" + std::to_string(i)).to(dtype).detach().set_requires_grad());
  Tensor y = fn(leaves);
  Tolerance tol = tolerance(dtype);
  tol.rtol = std::max(tol.rtol, rtol_floor);
  EXPECT_TRUE(
      all_close(y.to(DType::F64).reshape(Shape{-1}), g.at(name + "_y").reshape(Shape{-1}), tol.rtol, tol.atol * scale))
      << name << " " << dtype_name(dtype) << ": output";
  y.backward(g.at(name + "_upstream").to(y.dtype()).reshape(y.shape()));
  for (size_t i = 0; i < inputs; ++i) {
    const std::string key = name + "_grad" + std::to_string(i);
    if (!g.tensors.count(key)) continue;
    ASSERT_TRUE(leaves[i].grad().defined()) << name << ": no gradient for input " << i;
    EXPECT_TRUE(all_close(leaves[i].grad().to(DType::F64), g.at(key), tol.rtol, tol.atol * scale))
        << name << " " << dtype_name(dtype) << ": gradient of input " << i;
  }
}

class CnnOpsGolden : public ::testing::TestWithParam<DType> {
 protected:
  static const testing::Golden& golden() {
    static const testing::Golden g = load_golden("cnn_ops");
    return g;
  }
};

TEST_P(CnnOpsGolden, MovingElementsMatchesPyTorch) {
  const DType t = GetParam();
  check_golden(
      golden(), "cat", 3, [](const std::vector<Tensor>& x) { return cat(x, 1); }, t);
  check_golden(
      golden(), "permute", 1,
      [](const std::vector<Tensor>& x) {
        return permute(x[0], {0, 3, 1, 2});
      },
      t);
  check_golden(
      golden(), "narrow", 1, [](const std::vector<Tensor>& x) { return narrow(x[0], 2, 1, 3); }, t);
  check_golden(
      golden(), "where", 3,
      [](const std::vector<Tensor>& x) { return where(gt(x[0], Tensor::zeros(Shape{}, x[0].dtype())), x[1], x[2]); },
      t);
}

TEST_P(CnnOpsGolden, ActivationsMatchPyTorch) {
  const DType t = GetParam();
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> acts{
      {"clamp_both", [](const Tensor& x) { return clamp(x, -0.5, 1.5); }},
      {"clamp_min", [](const Tensor& x) { return clamp(x, -1.0, std::nullopt); }},
      {"clamp_max", [](const Tensor& x) { return clamp(x, std::nullopt, 3.0); }},
      {"hardtanh", [](const Tensor& x) { return hardtanh(x, -2.0, 2.5); }},
      {"relu6", [](const Tensor& x) { return relu6(x); }},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.2); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApproximation::Tanh); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"hardswish", [](const Tensor& x) { return hardswish(x); }},
      {"hardsigmoid", [](const Tensor& x) { return hardsigmoid(x); }},
  };
  for (const auto& [name, fn] : acts) {
    if (t == DType::BF16) {
      // Rounding the inputs to bf16 moves some onto an edge (6 for ReLU6): the bf16 path is held to ringtrain's
      // f64 path on the same rounded inputs (the f64 path is held to PyTorch's above).
      const Tensor x = golden().at(name + "_in0").to(DType::BF16);
      const Tensor up = golden().at(name + "_upstream").to(DType::BF16);
      Tensor a = x.detach().set_requires_grad(), b = x.to(DType::F64).detach().set_requires_grad();
      Tensor ya = fn(a), yb = fn(b);
      EXPECT_TRUE(all_close(ya.to(DType::F64), yb, 1e-2, 1e-2)) << name;
      ya.backward(up);
      yb.backward(up.to(DType::F64));
      EXPECT_TRUE(all_close(a.grad().to(DType::F64), b.grad(), 1e-2, 1e-2)) << name;
      continue;
    }
    // PyTorch's f64 hardsigmoid backward multiplies by 1/6 rounded to f32 (relative 3e-8 off); ringtrain's is exact.
    check_golden(
        golden(), name, 1, [&fn = fn](const std::vector<Tensor>& x) { return fn(x[0]); }, t, 1.0,
        name == "hardsigmoid" ? 1e-7 : 0.0);
  }
}

TEST_P(CnnOpsGolden, LayerAndGroupNormMatchPyTorch) {
  const DType t = GetParam();
  // Parameters stay f32 (f64 for f64 inputs), as batch norm's: the master copies under mixed precision.
  const DType p = t == DType::F64 ? DType::F64 : DType::F32;
  auto params = [p](const std::vector<Tensor>& x) { return std::pair<Tensor, Tensor>{x[1].to(p), x[2].to(p)}; };
  check_golden(
      golden(), "layer_norm", 3,
      [&](const std::vector<Tensor>& x) {
        auto [w, b] = params(x);
        return layer_norm(x[0], w, b, 1e-6);
      },
      t, 4.0);
  check_golden(
      golden(), "layer_norm_plain", 1, [](const std::vector<Tensor>& x) { return layer_norm(x[0], {}, {}, 1e-5); }, t,
      4.0);
  for (int64_t groups : {1, 3, 6})
    check_golden(
        golden(), "group_norm" + std::to_string(groups), 3,
        [&](const std::vector<Tensor>& x) {
          auto [w, b] = params(x);
          return group_norm(x[0], groups, w, b, 1e-5);
        },
        t, 4.0);
  check_golden(
      golden(), "group_norm_plain", 1, [](const std::vector<Tensor>& x) { return group_norm(x[0], 2, {}, {}, 1e-5); },
      t, 4.0);
}

TEST_P(CnnOpsGolden, PoolingAndUpsamplingMatchPyTorch) {
  const DType t = GetParam();
  check_golden(
      golden(), "adaptive3x2", 1, [](const std::vector<Tensor>& x) { return adaptive_avg_pool2d(x[0], 3, 2); }, t);
  check_golden(
      golden(), "adaptive1x1", 1, [](const std::vector<Tensor>& x) { return adaptive_avg_pool2d(x[0], 1, 1); }, t);
  check_golden(
      golden(), "adaptive9x7", 1, [](const std::vector<Tensor>& x) { return adaptive_avg_pool2d(x[0], 9, 7); }, t);
  auto up = [](UpsampleOptions o) { return [o](const std::vector<Tensor>& x) { return upsample(x[0], o); }; };
  check_golden(golden(), "up_nearest_size", 1, up({.out_h = 11, .out_w = 7}), t);
  check_golden(golden(), "up_nearest_scale2", 1, up({.scale_h = 2, .scale_w = 2}), t);
  check_golden(golden(), "up_nearest_exact", 1, up({.out_h = 8, .out_w = 5, .mode = UpsampleMode::NearestExact}), t);
  check_golden(golden(), "up_bilinear", 1, up({.out_h = 9, .out_w = 7, .mode = UpsampleMode::Bilinear}), t);
  check_golden(golden(), "up_bilinear_corners", 1,
               up({.out_h = 9, .out_w = 7, .mode = UpsampleMode::Bilinear, .align_corners = true}), t);
  check_golden(golden(), "up_bilinear_scale", 1, up({.scale_h = 1.7, .scale_w = 1.7, .mode = UpsampleMode::Bilinear}),
               t);
  check_golden(golden(), "up_bilinear_down", 1, up({.out_h = 3, .out_w = 2, .mode = UpsampleMode::Bilinear}), t);
}

TEST_P(CnnOpsGolden, TransposedConvolutionMatchesPyTorch) {
  const DType t = GetParam();
  for (const std::string name : {"tconv_s2_op1", "tconv_grouped_dilated", "tconv_k2s2"}) {
    const auto& m = golden().meta;
    auto at = [&](const char* k) { return static_cast<int64_t>(m.at(name + "_" + k)); };
    const ConvTranspose2dParams p{.stride_h = at("stride"),
                                  .stride_w = at("stride"),
                                  .pad_h = at("padding"),
                                  .pad_w = at("padding"),
                                  .output_pad_h = at("output_padding"),
                                  .output_pad_w = at("output_padding"),
                                  .dilation_h = at("dilation"),
                                  .dilation_w = at("dilation"),
                                  .groups = at("groups")};
    check_golden(
        golden(), name, 3, [&](const std::vector<Tensor>& x) { return conv_transpose2d(x[0], x[1], x[2], p); }, t,
        t == DType::BF16 ? 30.0 : 4.0);
  }
}

TEST_P(CnnOpsGolden, PerPixelCrossEntropyMatchesPyTorch) {
  const DType t = GetParam();
  const Tensor labels = golden().at("seg_labels").to(DType::I64);
  const DType loss_dtype = t == DType::F64 ? DType::F64 : DType::F32;
  const Tensor weight = golden().at("seg_weight").to(loss_dtype);
  auto ce = [&](CrossEntropyOptions o) {
    o.ignore_index = 255;
    return [o, &labels](const std::vector<Tensor>& x) { return cross_entropy(x[0], labels, o); };
  };
  check_golden(golden(), "seg_ce", 1, ce({}), t);
  check_golden(golden(), "seg_ce_weighted", 1, ce({.weight = weight}), t);
  check_golden(golden(), "seg_ce_weighted_smooth", 1, ce({.label_smoothing = 0.1, .weight = weight}), t);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CnnOpsGolden, ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// ---------------------------------------------------------------------------------------------------
// What the ops do

std::vector<double> iota(int64_t n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<double>(i);
  return v;
}

TEST(CnnOps, CatSplitAndChunkInvertEachOther) {
  const Tensor x = Tensor::from_vector(iota(2 * 5 * 3), Shape{2, 5, 3});
  for (int dim : {0, 1, 2, -1}) {
    std::vector<Tensor> pieces = split(x, 2, dim);
    const int d = dim < 0 ? dim + 3 : dim;
    const int64_t n = x.size(d);
    ASSERT_EQ(pieces.size(), static_cast<size_t>((n + 1) / 2)) << dim;
    EXPECT_EQ(pieces.back().size(d), n % 2 ? 1 : 2);
    EXPECT_EQ(cat(pieces, dim).to_vector(), x.to_vector()) << dim;
  }
  // torch.chunk: pieces of ceil(n / chunks), fewer pieces when those cover the dim.
  const Tensor v = Tensor::from_vector(iota(10), Shape{10});
  auto sizes = [](const std::vector<Tensor>& p) {
    std::vector<int64_t> s;
    for (const Tensor& t : p) s.push_back(t.numel());
    return s;
  };
  EXPECT_EQ(sizes(chunk(v, 3, 0)), (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(sizes(chunk(v.slice(0, 6), 4, 0)), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes(split(v, std::vector<int64_t>{3, 0, 7}, 0)), (std::vector<int64_t>{3, 0, 7}));
  // Gradients route back to each piece.
  Tensor a = random_f64(Shape{2, 3}, 1).set_requires_grad(), b = random_f64(Shape{2, 1}, 2).set_requires_grad();
  Tensor c = cat({a, b}, 1);
  c.backward(Tensor::from_vector(iota(8, 1), Shape{2, 4}, DType::F64));
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{4, 8}));
}

TEST(CnnOps, NarrowAndSelectOnTheFirstDimAreViews) {
  const Tensor x = Tensor::from_vector(iota(4 * 3), Shape{4, 3});
  EXPECT_TRUE(narrow(x, 0, 1, 2).shares_storage_with(x));
  EXPECT_TRUE(select(x, 0, -1).shares_storage_with(x));
  EXPECT_EQ(select(x, 0, -1).to_vector(), (std::vector<double>{9, 10, 11}));
  EXPECT_EQ(select(x, 1, 2).to_vector(), (std::vector<double>{2, 5, 8, 11}));
  EXPECT_EQ(select(x, 1, 2).shape(), (Shape{4}));
  // Leading dims of 1 keep the elements contiguous: a view too.
  const Tensor y = x.reshape(Shape{1, 4, 3});
  EXPECT_TRUE(narrow(y, 1, 2, 2).shares_storage_with(x));
  EXPECT_EQ(narrow(y, 1, 2, 2).to_vector(), (std::vector<double>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(narrow(x, 1, -2, 2).to_vector(), (std::vector<double>{1, 2, 4, 5, 7, 8, 10, 11}));
}

TEST(CnnOps, PermuteTransposeAndExpand) {
  const Tensor x = Tensor::from_vector(iota(2 * 3 * 4), Shape{2, 3, 4});
  const Tensor t = transpose(x, 0, 2);
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.to_vector()[1], 12);  // t[0, 0, 1] = x[1, 0, 0]
  EXPECT_EQ(permute(permute(x, {2, 0, 1}), {1, 2, 0}).to_vector(), x.to_vector());
  EXPECT_TRUE(contiguous(x).shares_storage_with(x));
  const Tensor e = expand(Tensor::from_vector({1, 2, 3}, Shape{3, 1}), Shape{2, 3, 2});
  EXPECT_EQ(e.to_vector(), (std::vector<double>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  Tensor s = random_f64(Shape{3, 1}, 3).set_requires_grad();
  expand(s, Shape{2, 3, 2}).backward(Tensor::ones(Shape{2, 3, 2}, DType::F64));
  EXPECT_EQ(s.grad().to_vector(), (std::vector<double>{4, 4, 4}));
  // Every dtype moves (bytes, no arithmetic).
  for (DType d : {DType::U8, DType::I32, DType::I64, DType::BF16, DType::F16})
    EXPECT_EQ(permute(x.to(d), {1, 0, 2}).to_vector(), permute(x, {1, 0, 2}).to_vector()) << dtype_name(d);
}

TEST(CnnOps, WhereBroadcastsAndSendsGradientsToTheChosenSide) {
  Tensor a = Tensor::from_vector({1, 2, 3}, Shape{3}, DType::F64).set_requires_grad();
  Tensor b = Tensor::from_vector({-1}, Shape{1}, DType::F64).set_requires_grad();
  const Tensor cond = Tensor::from_vector({1, 0, 1, 0, 0, 1}, Shape{2, 3}, DType::U8);
  Tensor y = where(cond, a, b);
  EXPECT_EQ(y.to_vector(), (std::vector<double>{1, -1, 3, -1, -1, 3}));
  sum(y).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{1, 0, 2}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{3}));
}

TEST(CnnOps, ClampAndHardtanhKeepGradientStrictlyInside) {
  Tensor x = Tensor::from_vector({-2, 0, 0.5, 6, 7}, Shape{5}, DType::F64).set_requires_grad();
  Tensor y = clamp(x, 0.0, 6.0);
  EXPECT_EQ(y.to_vector(), (std::vector<double>{0, 0, 0.5, 6, 6}));
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 1, 0, 0}));  // none at a bound itself
  x.zero_grad();
  sum(relu6(x)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 1, 0, 0}));
  // min above max: everything is max (PyTorch's rule); NaN passes through.
  EXPECT_EQ(clamp(Tensor::from_vector({-1, 5}, Shape{2}), 3.0, 1.0).to_vector(), (std::vector<double>{1, 1}));
  EXPECT_TRUE(std::isnan(clamp(Tensor::full(Shape{1}, std::nan("")), 0.0, 1.0).item()));
}

// The f32 paths (their own exp and erfc, vectorized) against f64 over a wide range, from the same f32 inputs.
// Values within 2e-5 relative everywhere (3e-6 down to GELU's x = -5.7); gradients within a few f32 roundings
// of their terms (GELU's and SiLU's cancel near x = -0.75 and -1.3, as in any f32 evaluation).
TEST(CnnOps, FastF32ActivationsStayWithinFloatRounding) {
  std::vector<double> v;
  for (double z = -12; z <= 12; z += 0.0173) v.push_back(z);
  for (double z : {0.0, 1e-7, -1e-7, 1e-30, -87.0, -88.0, -90.0, 88.0, 100.0, -100.0}) v.push_back(z);
  const Tensor x64 = Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}, DType::F64);
  const Tensor x32 = x64.to(DType::F32);
  const Tensor up = random_f64(x64.shape(), 9, 0.5, 1.5);
  for (auto [name, fn] : std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>>{
           {"gelu", [](const Tensor& x) { return gelu(x); }},
           {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApproximation::Tanh); }},
           {"silu", [](const Tensor& x) { return silu(x); }}}) {
    Tensor a = x64.to(DType::F32).to(DType::F64).detach().set_requires_grad(), b = x32.detach().set_requires_grad();
    Tensor ya = fn(a), yb = fn(b);
    EXPECT_TRUE(all_close(yb.to(DType::F64), ya, 2e-5, 1e-37)) << name;
    EXPECT_TRUE(all_close(narrow(yb, 0, 368, 652).to(DType::F64), narrow(ya, 0, 368, 652), 3e-6, 1e-37)) << name;
    ya.backward(up);
    yb.backward(up.to(DType::F32));
    EXPECT_TRUE(all_close(b.grad().to(DType::F64), a.grad(), 2e-6, 1e-7)) << name;
  }
}

TEST(CnnOps, LayerNormNormalisesEachPositionAndKeepsF32StatisticsForBf16) {
  const Tensor x = random_f64(Shape{3, 2, 2, 5}, 11, -2, 4);
  const Tensor y = layer_norm(x, {}, {}, 1e-5);
  const Tensor m = mean(y, -1), v = mean(mul(y, y), -1);
  EXPECT_TRUE(all_close(m, Tensor::zeros(m.shape(), DType::F64), 0, 1e-12));
  EXPECT_TRUE(all_close(v, Tensor::ones(v.shape(), DType::F64), 0, 1e-4));
  // bf16 activations with f32 parameters (autocast): within bf16 rounding of the f32 result.
  const Tensor w = random_f64(Shape{5}, 12).to(DType::F32), b = random_f64(Shape{5}, 13).to(DType::F32);
  const Tensor y32 = layer_norm(x.to(DType::F32), w, b), y16 = layer_norm(x.to(DType::BF16), w, b);
  EXPECT_EQ(y16.dtype(), DType::BF16);
  EXPECT_TRUE(all_close(y16.to(DType::F32), y32, 2e-2, 2e-2));
  // A one-value row normalises to 0 (variance 0, rstd 1 / sqrt(eps)).
  EXPECT_EQ(layer_norm(Tensor::full(Shape{2, 1}, 3.0), {}, {}).to_vector(), (std::vector<double>{0, 0}));
}

TEST(CnnOps, DropPathKeepsOrDropsWholeSamplesFromTheirGlobalIndex) {
  const Tensor x = Tensor::ones(Shape{64, 2, 2, 3});
  const Tensor y = drop_path(x, 0.25, true, 5, 9, 0);
  const std::vector<double> v = y.to_vector();
  int kept = 0;
  for (int64_t n = 0; n < 64; ++n) {
    const double first = v[static_cast<size_t>(n * 12)];
    for (int64_t k = 0; k < 12; ++k) EXPECT_EQ(v[static_cast<size_t>(n * 12 + k)], first) << "sample " << n;
    EXPECT_TRUE(first == 0.0 || std::abs(first - 1 / 0.75) < 1e-6) << first;
    kept += first != 0.0;
  }
  EXPECT_GT(kept, 32);
  EXPECT_LT(kept, 60);
  // Two ranks' halves, each keyed by where its samples sit in the global batch, are the whole batch's draws.
  const Tensor lo = drop_path(x.slice(0, 24), 0.25, true, 5, 9, 0),
               hi = drop_path(x.slice(24, 64), 0.25, true, 5, 9, 24);
  EXPECT_EQ(cat({lo, hi}, 0).to_vector(), v);
  // Identity in eval or at p = 0; p = 1 drops everything.
  EXPECT_TRUE(drop_path(x, 0.5, false, 5, 9, 0).shares_storage_with(x));
  EXPECT_TRUE(drop_path(x, 0.0, true, 5, 9, 0).shares_storage_with(x));
  EXPECT_EQ(sum(drop_path(x, 1.0, true, 5, 9, 0)).item(), 0.0);
  // The gradient is the mask.
  Tensor g = x.detach().clone().set_requires_grad();
  sum(drop_path(g, 0.25, true, 5, 9, 0)).backward();
  EXPECT_EQ(g.grad().to_vector(), v);
}

TEST(CnnOps, DropPathAndDropoutUnderSampleDrawsDependOnStepAndPlaceNotOnTheSplit) {
  const Tensor x = Tensor::ones(Shape{8, 3});
  manual_seed(3);
  // One process, one micro-batch of 8: two drop_path calls (places 0 and 1) in the step's forward.
  set_rng_stream(100);
  set_sample_draws({.set = true, .step = 4, .first_sample = 0, .micro_origin = 100});
  const std::vector<double> a0 = drop_path(x, 0.5).to_vector(), a1 = drop_path(x, 0.5).to_vector();
  // Two micro-batches of 4 whose forwards start at other streams: the same draws per sample and place.
  set_rng_stream(500);
  set_sample_draws({.set = true, .step = 4, .first_sample = 0, .micro_origin = 500});
  Tensor b0 = drop_path(x.slice(0, 4), 0.5), b1 = drop_path(x.slice(0, 4), 0.5);
  set_rng_stream(502);
  set_sample_draws({.set = true, .step = 4, .first_sample = 4, .micro_origin = 502});
  Tensor c0 = drop_path(x.slice(4, 8), 0.5), c1 = drop_path(x.slice(4, 8), 0.5);
  EXPECT_EQ(cat({b0, c0}, 0).to_vector(), a0);
  EXPECT_EQ(cat({b1, c1}, 0).to_vector(), a1);
  EXPECT_NE(a0, a1);
  // Dropout is keyed the same way: each sample's elements at its place in the global batch.
  set_rng_stream(100);
  set_sample_draws({.set = true, .step = 4, .first_sample = 0, .micro_origin = 100});
  const std::vector<double> d = dropout(x, 0.5).to_vector();
  set_rng_stream(700);
  set_sample_draws({.set = true, .step = 4, .first_sample = 5, .micro_origin = 700});
  const std::vector<double> tail = dropout(x.slice(5, 8), 0.5).to_vector();
  EXPECT_EQ(std::vector<double>(d.begin() + 15, d.end()), tail);
  // Another step draws anew.
  set_rng_stream(100);
  set_sample_draws({.set = true, .step = 5, .first_sample = 0, .micro_origin = 100});
  EXPECT_NE(drop_path(x, 0.5).to_vector(), a0);
  set_sample_draws({});
}

TEST(CnnOps, CrossEntropyOverPixelsIgnoresAndWeighs) {
  // (N, H, W, C) logits: the mean over the pixels not ignored.
  const Tensor logits = random_f64(Shape{2, 2, 3, 4}, 21, -2, 2);
  std::vector<double> lab{0, 1, 2, 3, 255, 1, 2, 2, 0, 255, 3, 1};
  const Tensor labels = Tensor::from_vector(lab, Shape{2, 2, 3}, DType::I64);
  const Tensor loss = cross_entropy(logits, labels, {.ignore_index = 255});
  const Tensor logp = log_softmax(logits).reshape(Shape{12, 4});
  double expected = 0;
  int counted = 0;
  for (int r = 0; r < 12; ++r) {
    if (lab[static_cast<size_t>(r)] == 255) continue;
    expected -= logp.to_vector()[static_cast<size_t>(r * 4 + static_cast<int>(lab[static_cast<size_t>(r)]))];
    ++counted;
  }
  EXPECT_NEAR(loss.item(), expected / counted, 1e-12);
  // Every label ignored: NaN, as PyTorch's mean of nothing.
  const Tensor none = Tensor::full(Shape{2, 2, 3}, 255, DType::I64);
  EXPECT_TRUE(std::isnan(cross_entropy(logits, none, {.ignore_index = 255}).item()));
  // The (N, C) form without options is the mean over rows, as before.
  const Tensor flat = logits.reshape(Shape{12, 4});
  const Tensor flat_labels = Tensor::from_vector({0, 1, 2, 3, 0, 1, 2, 2, 0, 1, 3, 1}, Shape{12}, DType::I32);
  EXPECT_NEAR(cross_entropy(flat, flat_labels).item(), cross_entropy(flat, flat_labels, {}).item(), 0);
}

// ---------------------------------------------------------------------------------------------------
// Bad input, refused naming the op and the shapes

TEST(CnnOps, BadInputIsRefusedNamingOpAndShapes) {
  const Tensor a = Tensor::zeros(Shape{2, 3}), b = Tensor::zeros(Shape{3, 3});
  EXPECT_NE(error_of([&] {
              cat({a, b}, 1);
            }).find("op 'cat': tensor 1 f32[3, 3]"),
            std::string::npos)
      << error_of([&] {
           cat({a, b}, 1);
         });
  EXPECT_NE(error_of([&] { cat({a, a.to(DType::F64)}, 0); }).find("dtype mismatch"), std::string::npos);
  EXPECT_NE(error_of([&] { cat({}, 0); }).find("op 'cat': no tensors"), std::string::npos);
  EXPECT_NE(error_of([&] { cat({a, a}, 2); }).find("cat"), std::string::npos);
  EXPECT_NE(error_of([&] {
              split(a, std::vector<int64_t>{1, 1}, 1);
            }).find("add up to 2, not to dim 1 (3)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { chunk(a, 0, 0); }).find("op 'chunk': 0 chunks"), std::string::npos);
  EXPECT_NE(error_of([&] { narrow(a, 1, 2, 2); }).find("op 'narrow': [2, 4) of dim 1 is outside f32[2, 3]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { select(a, 0, 2); }).find("op 'select': index 2 is outside dim 0"), std::string::npos);
  EXPECT_NE(error_of([&] { permute(a, {0, 0}); }).find("name dim 0 twice"), std::string::npos);
  EXPECT_NE(error_of([&] { permute(a, {0}); }).find("op 'permute': 1 dims (0) for f32[2, 3]"), std::string::npos);
  EXPECT_NE(error_of([&] {
              expand(a, Shape{4, 3});
            }).find("op 'expand': f32[2, 3] on cpu cannot expand to [4, 3] (dim 0: 2 vs 4)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { where(a, a, a); }).find("op 'where': the condition must be u8"), std::string::npos);
  EXPECT_NE(error_of([&] { where(Tensor::zeros(Shape{4}, DType::U8), a, a); }).find("do not broadcast"),
            std::string::npos);
  EXPECT_NE(error_of([&] { clamp(a, std::nullopt, std::nullopt); }).find("op 'clamp': give a min, a max"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gelu(Tensor::zeros(Shape{2}, DType::I32)); }).find("op 'gelu' needs a floating-point"),
            std::string::npos);
  const Tensor img = Tensor::zeros(Shape{2, 4, 4, 6});
  EXPECT_NE(
      error_of([&] { group_norm(img, 4, {}, {}); }).find("op 'group_norm': 4 groups do not divide the 6 channels"),
      std::string::npos);
  EXPECT_NE(error_of([&] { group_norm(img, 3, Tensor::ones(Shape{6}), {}); }).find("give both weight and bias"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              layer_norm(img, Tensor::ones(Shape{4}), Tensor::zeros(Shape{4}));
            }).find("op 'layer_norm': f32[4] on cpu must be f32[6] on cpu for input f32[2, 4, 4, 6]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              upsample(Tensor::zeros(Shape{4, 4, 6}), {.scale_h = 2, .scale_w = 2});
            }).find("op 'upsample': expected an NHWC image batch (N, H, W, C), got f32[4, 4, 6]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              upsample(img, {.out_h = 8, .out_w = 8, .align_corners = true});
            }).find("align_corners applies to bilinear"),
            std::string::npos);
  EXPECT_NE(error_of([&] { upsample(img, {.out_h = 8, .out_w = 8, .scale_h = 2, .scale_w = 2}); }).find("both"),
            std::string::npos);
  EXPECT_NE(error_of([&] { adaptive_avg_pool2d(img, 0, 2); }).find("must be at least 1x1"), std::string::npos);
  EXPECT_NE(error_of([&] {
              conv_transpose2d(img, Tensor::zeros(Shape{6, 3, 3, 2}), {},
                               {.stride_h = 2, .stride_w = 2, .output_pad_h = 2, .output_pad_w = 0});
            }).find("output padding (2, 0) must be smaller than the stride (2, 2)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              conv_transpose2d(img, Tensor::zeros(Shape{5, 3, 3, 2}), {}, {});
            }).find("op 'conv_transpose2d': input f32[2, 4, 4, 6] on cpu with 1 group(s) needs weight (6, R, S"),
            std::string::npos);
  EXPECT_NE(error_of([&] { drop_path(img, 1.5, true); }).find("op 'drop_path': probability must be in [0, 1]"),
            std::string::npos);
  const Tensor seg = Tensor::zeros(Shape{1, 2, 2, 3});
  const Tensor bad = Tensor::from_vector({0, 1, 7, 2}, Shape{1, 2, 2}, DType::I64);
  EXPECT_NE(error_of([&] {
              cross_entropy(seg, bad, {.ignore_index = 255});
            }).find("label 7 at position (0, 1, 0) is outside [0, 3) and not the ignore index 255"),
            std::string::npos)
      << error_of([&] { cross_entropy(seg, bad, {.ignore_index = 255}); });
  EXPECT_NE(error_of([&] {
              cross_entropy(seg, bad.reshape(Shape{4}), {});
            }).find("labels must be i32 or i64 of shape [1, 2, 2]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              cross_entropy(seg, Tensor::zeros(Shape{1, 2, 2}, DType::I64), {.weight = Tensor::ones(Shape{2})});
            }).find("class weights f32[2] on cpu must be f32[3] on cpu"),
            std::string::npos);
}

}  // namespace
}  // namespace ringtrain
