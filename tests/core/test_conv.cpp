// Convolution: PyTorch goldens (NHWC/KRSC dumps) in f64 and f32, oneDNN (f32) against the f64
// reference loops over many geometries (direct and Winograd), 16-bit inputs, and argument errors.
#include <gtest/gtest.h>

#include "core/check.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;
using testing::load_golden;

struct GoldenConv {
  std::string name;
  Conv2dParams params;
};

TEST(Conv, MatchesPyTorchForwardAndBackward) {
  auto g = load_golden("conv");
  std::vector<GoldenConv> cases{
      {"plain", {.pad_h = 1, .pad_w = 1}},
      {"strided", {.stride_h = 2, .stride_w = 2}},
      {"dilated_grouped", {.pad_h = 2, .pad_w = 2, .dilation_h = 2, .dilation_w = 2, .groups = 2}}};
  for (const auto& c : cases) {
    for (DType dtype : {DType::F64, DType::F32}) {
      const double tol = dtype == DType::F64 ? 1e-12 : 1e-4;
      Tensor x = g.at(c.name + "_x").to(dtype).detach().set_requires_grad();
      Tensor w = g.at(c.name + "_w").to(dtype).detach().set_requires_grad();
      Tensor b = g.at(c.name + "_b").to(dtype).detach().set_requires_grad();
      Tensor y = conv2d(x, w, b, c.params);
      EXPECT_TRUE(all_close(y, g.at(c.name + "_y"), tol, tol)) << c.name << " " << dtype_name(dtype);
      y.backward(g.at(c.name + "_upstream").to(dtype));
      EXPECT_TRUE(all_close(x.grad(), g.at(c.name + "_grad_x"), tol, tol)) << c.name << " " << dtype_name(dtype);
      EXPECT_TRUE(all_close(w.grad(), g.at(c.name + "_grad_w"), tol, tol)) << c.name << " " << dtype_name(dtype);
      EXPECT_TRUE(all_close(b.grad(), g.at(c.name + "_grad_b"), tol, tol)) << c.name << " " << dtype_name(dtype);
    }
  }
}

struct Geometry {
  int64_t n, h, w, c, k, r, s;
  Conv2dParams p;
  bool bias;
};

// Sets the CPU convolution choice for a scope.
struct ConvChoice {
  CpuConvolution before = cpu_convolution();
  explicit ConvChoice(CpuConvolution c) { set_cpu_convolution(c); }
  ~ConvChoice() { set_cpu_convolution(before); }
};

class ConvOneDnnVsReference : public ::testing::TestWithParam<std::tuple<Geometry, CpuConvolution>> {};

TEST_P(ConvOneDnnVsReference, ForwardAndBackwardAgree) {
  const Geometry& geo = std::get<0>(GetParam());
  ConvChoice choice(std::get<1>(GetParam()));
  Tensor x = testing::random_f64(Shape{geo.n, geo.h, geo.w, geo.c}, 1);
  Tensor w = testing::random_f64(Shape{geo.k, geo.r, geo.s, geo.c / geo.p.groups}, 2);
  Tensor b = geo.bias ? testing::random_f64(Shape{geo.k}, 3) : Tensor();
  auto run = [&](DType dtype, std::vector<Tensor>& grads) {
    Tensor xi = x.to(dtype).detach().set_requires_grad(), wi = w.to(dtype).detach().set_requires_grad();
    Tensor bi = geo.bias ? b.to(dtype).detach().set_requires_grad() : Tensor();
    Tensor y = conv2d(xi, wi, bi, geo.p);
    Tensor up = testing::random_f64(y.shape(), 4).to(dtype);
    y.backward(up);
    grads = {xi.grad(), wi.grad()};
    if (geo.bias) grads.push_back(bi.grad());
    return y;
  };
  std::vector<Tensor> ref_grads, fast_grads;
  Tensor ref = run(DType::F64, ref_grads), fast = run(DType::F32, fast_grads);
  EXPECT_TRUE(all_close(fast, ref, 1e-4, 1e-4));
  for (size_t i = 0; i < ref_grads.size(); ++i) EXPECT_TRUE(all_close(fast_grads[i], ref_grads[i], 1e-4, 1e-4)) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, ConvOneDnnVsReference,
    ::testing::Combine(
        ::testing::Values(
            Geometry{2, 8, 8, 16, 16, 3, 3, {.pad_h = 1, .pad_w = 1}, false},
            Geometry{3, 9, 7, 5, 8, 3, 3, {.stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}, true},
            Geometry{2, 8, 8, 8, 4, 1, 1, {.stride_h = 2, .stride_w = 2}, false},
            Geometry{
                1, 10, 10, 6, 6, 3, 3, {.pad_h = 2, .pad_w = 2, .dilation_h = 2, .dilation_w = 2, .groups = 3}, true},
            Geometry{2, 7, 7, 3, 4, 7, 7, {.stride_h = 2, .stride_w = 2, .pad_h = 3, .pad_w = 3}, false},
            Geometry{2, 5, 6, 4, 4, 3, 2, {.pad_h = 1, .pad_w = 0, .groups = 4}, true},
            // Winograd's shapes (3x3, stride 1, >= 32 channels in multiples of 16, outputs of
            // at least 8x8), with and without padding, odd sizes (partial 4x4 tiles), a bias
            Geometry{2, 8, 8, 32, 32, 3, 3, {.pad_h = 1, .pad_w = 1}, true},
            Geometry{3, 9, 11, 64, 48, 3, 3, {.pad_h = 1, .pad_w = 1}, false},
            Geometry{2, 10, 12, 32, 64, 3, 3, {}, false},
            Geometry{2, 4, 4, 32, 32, 3, 3, {.pad_h = 1, .pad_w = 1}, false}),  // too small: direct
        ::testing::Values(CpuConvolution::Auto, CpuConvolution::Direct)));

// On a CPU where oneDNN has Winograd (AVX-512), Auto really takes it on its shapes: the rounding differs
// from direct convolution's (else the tests above would not cover the nChw16c reorders). Both stay within
// float noise of each other over a few steps of gradients.
TEST(Conv, AutoRunsWinogradWhereOneDnnHasIt) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "no AVX-512: oneDNN has no Winograd convolution here";
  Tensor x = Tensor::uniform(Shape{4, 12, 12, 32}, -1, 1, 11), w = Tensor::uniform(Shape{32, 3, 3, 32}, -1, 1, 12);
  Tensor up = Tensor::uniform(Shape{4, 12, 12, 32}, -1, 1, 13);
  auto run = [&](CpuConvolution c, std::vector<Tensor>& grads) {
    ConvChoice choice(c);
    Tensor xi = x.detach().set_requires_grad(), wi = w.detach().set_requires_grad();
    Tensor y = conv2d(xi, wi, Tensor(), {.pad_h = 1, .pad_w = 1});
    y.backward(up);
    grads = {xi.grad(), wi.grad()};
    return y;
  };
  std::vector<Tensor> g_auto, g_direct;
  Tensor y_auto = run(CpuConvolution::Auto, g_auto), y_direct = run(CpuConvolution::Direct, g_direct);
  EXPECT_FALSE(all_close(y_auto, y_direct, 0, 0)) << "Auto gave direct convolution's bits";
  EXPECT_TRUE(all_close(y_auto, y_direct, 1e-4, 1e-4));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(all_close(g_auto[i], g_direct[i], 0, 0)) << i;
    EXPECT_TRUE(all_close(g_auto[i], g_direct[i], 1e-4, 1e-3)) << i;
  }
}

// Today's CNNs' depthwise (MobileNet's 3x3, EfficientNet's 5x5, ConvNeXt's 7x7, strided too) and grouped
// convolutions get oneDNN's JIT kernels in every pass, never its reference loops (about 800x slower).
TEST(Conv, DepthwiseAndGroupedConvolutionsNeverRunOneDnnsReferenceLoops) {
  struct Case {
    const char* name;
    int64_t c, k, r, stride, groups;
  };
  const Case cases[] = {{"depthwise 3x3", 32, 32, 3, 1, 32},
                        {"depthwise 3x3 stride 2", 96, 96, 3, 2, 96},
                        {"depthwise 5x5 stride 2", 144, 144, 5, 2, 144},
                        {"depthwise 7x7", 96, 96, 7, 1, 96},
                        {"depthwise 3x3, 24 channels", 24, 24, 3, 1, 24},
                        {"grouped 3x3, 4 groups", 64, 64, 3, 1, 4}};
  for (const Case& c : cases) {
    ConvGeometry g;
    g.n = 8, g.h = 16, g.w = 16, g.c = c.c, g.k = c.k, g.r = g.s = c.r;
    g.stride_h = g.stride_w = c.stride, g.pad_h = g.pad_w = c.r / 2, g.groups = c.groups;
    g.p = (g.h + 2 * g.pad_h - g.r) / c.stride + 1, g.q = (g.w + 2 * g.pad_w - g.s) / c.stride + 1;
    for (int pass = 0; pass < 3; ++pass) {
      const std::string kernel = cpu_convolution_kernel(g, DType::F32, false, pass);
      EXPECT_NE(kernel.rfind("ref", 0), 0u) << c.name << ", pass " << pass << ": " << kernel;
    }
  }
}

// Plans are kept per thread count (a oneDNN primitive is built for the threads it runs on): changing the
// count between calls gives each its own plan, and the results agree with the f64 reference at both.
TEST(Conv, PlansFollowTheThreadCount) {
  const int before = num_threads();
  Tensor x = testing::random_f64(Shape{4, 10, 10, 32}, 21), w = testing::random_f64(Shape{32, 3, 3, 32}, 22);
  const Tensor ref = conv2d(x, w, Tensor(), {.pad_h = 1, .pad_w = 1});
  for (int threads : {2, 1, 2}) {
    set_num_threads(threads);
    Tensor y = conv2d(x.to(DType::F32), w.to(DType::F32), Tensor(), {.pad_h = 1, .pad_w = 1});
    EXPECT_TRUE(all_close(y, ref, 1e-4, 1e-4)) << threads << " thread(s)";
  }
  set_num_threads(before);
}

// f16 converts to f32 around the f32 kernels; bf16 does so too, or runs oneDNN's bf16 kernels where this
// CPU has them (tests/core/test_cpu_bf16.cpp covers those against f64): either way, within 16-bit noise.
TEST(Conv, SixteenBitInputsAgreeWithF32) {
  Tensor x = Tensor::uniform(Shape{1, 5, 5, 4}, -1, 1, 7), w = Tensor::uniform(Shape{3, 3, 3, 4}, -1, 1, 8);
  Tensor y32 = conv2d(x, w, Tensor(), {.pad_h = 1, .pad_w = 1});
  for (DType t : {DType::BF16, DType::F16}) {
    Tensor y = conv2d(x.to(t), w.to(t), Tensor(), {.pad_h = 1, .pad_w = 1});
    EXPECT_EQ(y.dtype(), t);
    EXPECT_TRUE(all_close(y.to(DType::F32), y32, 5e-2, 5e-2)) << dtype_name(t);
  }
}

TEST(Conv, BadArgumentsNameTheProblem) {
  Tensor x = Tensor::zeros(Shape{1, 5, 5, 4}), w = Tensor::zeros(Shape{3, 3, 3, 4});
  auto err = testing::error_of;
  EXPECT_NE(err([&] {
              conv2d(x, Tensor::zeros(Shape{3, 3, 3, 5}), Tensor(), {});
            }).find("weight (K, R, S, 4)"),
            std::string::npos);
  EXPECT_NE(err([&] { conv2d(x, w, Tensor(), {.stride_h = 0}); }).find("stride"), std::string::npos);
  EXPECT_NE(err([&] { conv2d(x, w, Tensor::zeros(Shape{4}), {}); }).find("bias"), std::string::npos);
  EXPECT_NE(err([&] {
              conv2d(Tensor::zeros(Shape{1, 2, 2, 4}), w, Tensor(), {});
            }).find("smaller than the 3x3"),
            std::string::npos);
  EXPECT_NE(err([&] { conv2d(x.reshape(Shape{25, 4}), w, Tensor(), {}); }).find("(N, H, W, C)"), std::string::npos);
  EXPECT_NE(err([&] { conv2d(x, w, Tensor(), {.groups = 3}); }).find("3 group(s)"), std::string::npos);
}

}  // namespace
}  // namespace ringtrain
