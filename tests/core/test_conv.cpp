// Convolution: PyTorch goldens (NHWC/KRSC dumps) in f64 and f32, oneDNN (f32) against the f64
// reference loops over many geometries, 16-bit inputs, and argument errors.
#include <gtest/gtest.h>

#include "core/check.h"
#include "core/ops.h"
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
  std::vector<GoldenConv> cases{{"plain", {.pad_h = 1, .pad_w = 1}},
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

class ConvOneDnnVsReference : public ::testing::TestWithParam<Geometry> {};

TEST_P(ConvOneDnnVsReference, ForwardAndBackwardAgree) {
  const Geometry& geo = GetParam();
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
    ::testing::Values(Geometry{2, 8, 8, 16, 16, 3, 3, {.pad_h = 1, .pad_w = 1}, false},
                      Geometry{3, 9, 7, 5, 8, 3, 3, {.stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}, true},
                      Geometry{2, 8, 8, 8, 4, 1, 1, {.stride_h = 2, .stride_w = 2}, false},
                      Geometry{1, 10, 10, 6, 6, 3, 3, {.pad_h = 2, .pad_w = 2, .dilation_h = 2, .dilation_w = 2, .groups = 3}, true},
                      Geometry{2, 7, 7, 3, 4, 7, 7, {.stride_h = 2, .stride_w = 2, .pad_h = 3, .pad_w = 3}, false},
                      Geometry{2, 5, 6, 4, 4, 3, 2, {.pad_h = 1, .pad_w = 0, .groups = 4}, true}));

TEST(Conv, SixteenBitInputsGoThroughF32) {
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
  EXPECT_NE(err([&] { conv2d(x, Tensor::zeros(Shape{3, 3, 3, 5}), Tensor(), {}); }).find("weight (K, R, S, 4)"),
            std::string::npos);
  EXPECT_NE(err([&] { conv2d(x, w, Tensor(), {.stride_h = 0}); }).find("stride"), std::string::npos);
  EXPECT_NE(err([&] { conv2d(x, w, Tensor::zeros(Shape{4}), {}); }).find("bias"), std::string::npos);
  EXPECT_NE(err([&] { conv2d(Tensor::zeros(Shape{1, 2, 2, 4}), w, Tensor(), {}); }).find("smaller than the 3x3"),
            std::string::npos);
  EXPECT_NE(err([&] { conv2d(x.reshape(Shape{25, 4}), w, Tensor(), {}); }).find("(N, H, W, C)"), std::string::npos);
  EXPECT_NE(err([&] { conv2d(x, w, Tensor(), {.groups = 3}); }).find("3 group(s)"), std::string::npos);
}

}  // namespace
}  // namespace ringtrain
