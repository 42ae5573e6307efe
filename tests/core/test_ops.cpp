// Tests for core/ops.h forward values: broadcasting, scalar/unary ops, comparisons, reductions,
// matmul/linear against naive loops, the softmax family, dropout, and 16-bit dtypes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/dispatch.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;
using testing::random_f64;

std::vector<double> v(const Tensor& t) { return t.to_vector(); }

TEST(Ops, BroadcastingMatchesNaiveIndexing) {
  Tensor a = random_f64(Shape{2, 1, 4}, 1);
  Tensor b = random_f64(Shape{3, 1}, 2);
  Tensor out = add(a, b);
  ASSERT_EQ(out.shape(), (Shape{2, 3, 4}));
  std::vector<double> va = v(a), vb = v(b), vo = v(out);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        EXPECT_DOUBLE_EQ(vo[static_cast<size_t>((i * 3 + j) * 4 + k)],
                         va[static_cast<size_t>(i * 4 + k)] + vb[static_cast<size_t>(j)]);
  // Row (bias) broadcast, scalar-tensor broadcast on either side.
  Tensor m = Tensor::from_vector({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor bias = Tensor::from_vector({10, 20, 30}, Shape{3});
  EXPECT_EQ(v(add(m, bias)), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(v(sub(Tensor::scalar(1.0), m)), (std::vector<double>{0, -1, -2, -3, -4, -5}));
  EXPECT_EQ(v(div(m, Tensor::scalar(2.0))), (std::vector<double>{0.5, 1, 1.5, 2, 2.5, 3}));
}

TEST(Ops, LargeBroadcastIsThreadCountIndependent) {
  Tensor a = Tensor::uniform(Shape{64, 33, 17}, -1, 1, 3);
  Tensor b = Tensor::uniform(Shape{33, 1}, -1, 1, 4);
  Tensor multi = mul(a, b);
  const int threads = num_threads();
  set_num_threads(1);
  Tensor single = mul(a, b);
  Tensor single_sum = sum(a);
  set_num_threads(threads);
  EXPECT_EQ(v(multi), v(single));
  EXPECT_EQ(sum(a).item(), single_sum.item());
}

TEST(Ops, ScalarAndUnary) {
  Tensor x = Tensor::from_vector({-2, -0.5, 0, 1, 4}, Shape{5}, DType::F64);
  EXPECT_EQ(v(relu(x)), (std::vector<double>{0, 0, 0, 1, 4}));
  EXPECT_EQ(v(neg(x)), (std::vector<double>{2, 0.5, 0, -1, -4}));
  EXPECT_EQ(v(abs(x)), (std::vector<double>{2, 0.5, 0, 1, 4}));
  EXPECT_EQ(v(x * 2.0 + 1.0), (std::vector<double>{-3, 0, 1, 3, 9}));
  EXPECT_EQ(v(10.0 - x), (std::vector<double>{12, 10.5, 10, 9, 6}));
  EXPECT_EQ(v(pow(x, 2.0)), (std::vector<double>{4, 0.25, 0, 1, 16}));
  Tensor p = Tensor::from_vector({0.25, 1, 4}, Shape{3}, DType::F64);
  EXPECT_EQ(v(sqrt(p)), (std::vector<double>{0.5, 1, 2}));
  EXPECT_EQ(v(rdiv(p, 1.0)), (std::vector<double>{4, 1, 0.25}));
  EXPECT_TRUE(all_close(v(exp(log(p))), v(p), 1e-15, 0));
  EXPECT_TRUE(all_close(v(tanh(p)), {std::tanh(0.25), std::tanh(1.0), std::tanh(4.0)}, 1e-15, 0));
  EXPECT_TRUE(all_close(v(sigmoid(p)), {1 / (1 + std::exp(-0.25)), 1 / (1 + std::exp(-1.0)), 1 / (1 + std::exp(-4.0))},
                        1e-15, 0));
  EXPECT_THROW(exp(Tensor::ones(Shape{2}, DType::I32)), Error);
}

// relu keeps NaN (as PyTorch's and the fused ReLU of batch_norm: a NaN is not hidden from the checks behind
// it), gives +0 for -0 and for negatives, and x elsewhere; its gradient is 0 at NaN and at 0. Every float
// dtype, in lengths that end mid-vector (the f32 and bf16 loops are vectorised).
TEST(Ops, ReluKeepsNaNAndGivesPlusZeroAtOrBelowZero) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (int64_t n : {5, 37, 1029}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n=" << n);
      std::vector<double> in(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const double pattern[] = {nan, -0.0, 0.0, -1.5, 2.0, inf, -inf, -nan};
        in[static_cast<size_t>(i)] = pattern[(i * 3 + n) % 8];
      }
      Tensor x = Tensor::from_vector(in, Shape{n}, DType::F64).to(t).set_requires_grad();
      Tensor y = relu(x);
      y.backward(Tensor::ones(Shape{n}, t));
      const std::vector<double> out = v(y), grad = v(x.grad());
      for (size_t i = 0; i < in.size(); ++i) {
        if (std::isnan(in[i])) {
          EXPECT_TRUE(std::isnan(out[i])) << i << ": relu(NaN) = " << out[i];
        } else if (in[i] <= 0) {
          EXPECT_EQ(out[i], 0.0) << i;
          EXPECT_FALSE(std::signbit(out[i])) << i << ": relu(" << in[i] << ") is -0";
        } else {
          EXPECT_EQ(out[i], in[i]) << i;
        }
        EXPECT_EQ(grad[i], in[i] > 0 ? 1.0 : 0.0) << i << ": the gradient at " << in[i];
      }
    }
}

TEST(Ops, IntegerArithmeticAndComparisons) {
  Tensor a = Tensor::from_vector({1, 5, 3, 7}, Shape{4}, DType::I32);
  Tensor b = Tensor::from_vector({2, 5, 1, 0}, Shape{4}, DType::I32);
  EXPECT_EQ(v(add(a, b)), (std::vector<double>{3, 10, 4, 7}));
  EXPECT_EQ(v(div(a, b)), (std::vector<double>{0, 1, 3, 0})) << "integer division truncates; /0 gives 0";
  EXPECT_EQ(v(maximum(a, b)), (std::vector<double>{2, 5, 3, 7}));
  Tensor lt_ab = lt(a, b);
  EXPECT_EQ(lt_ab.dtype(), DType::U8);
  EXPECT_EQ(v(lt_ab), (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(v(eq(a, b)), (std::vector<double>{0, 1, 0, 0}));
  EXPECT_EQ(v(ge(a, b)), (std::vector<double>{0, 1, 1, 1}));
  EXPECT_EQ(v(ne(a, b)), (std::vector<double>{1, 0, 1, 1}));
  EXPECT_EQ(v(le(a, b)), (std::vector<double>{1, 1, 0, 0}));
  EXPECT_EQ(v(gt(a, b)), (std::vector<double>{0, 0, 1, 1}));
  EXPECT_EQ(sum(a).item(), 16.0);
}

TEST(Ops, Reductions) {
  Tensor x = Tensor::from_vector({1, 5, 3, 7, 2, 6}, Shape{2, 3}, DType::F64);
  EXPECT_EQ(sum(x).item(), 24.0);
  EXPECT_EQ(sum(x).shape(), Shape{});
  EXPECT_EQ(v(sum(x, 0)), (std::vector<double>{8, 7, 9}));
  EXPECT_EQ(v(sum(x, -1)), (std::vector<double>{9, 15}));
  EXPECT_EQ(sum(x, 1, /*keepdim=*/true).shape(), (Shape{2, 1}));
  EXPECT_EQ(mean(x).item(), 4.0);
  EXPECT_EQ(v(mean(x, 0)), (std::vector<double>{4, 3.5, 4.5}));
  EXPECT_EQ(max(x).item(), 7.0);
  EXPECT_EQ(v(max(x, 1)), (std::vector<double>{5, 7}));
  EXPECT_EQ(v(argmax(x, 1)), (std::vector<double>{1, 0}));
  EXPECT_EQ(v(argmax(x, 0)), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(v(argmax(Tensor::from_vector({3, 3, 1}, Shape{3}), 0)), (std::vector<double>{0})) << "first maximum";
  EXPECT_THROW(sum(x, 2), Error);
  EXPECT_THROW(max(Tensor::zeros(Shape{0})), Error);
  // A long f32 sum is accurate (blocked, f64 combination).
  Tensor ones = Tensor::ones(Shape{1 << 22});
  EXPECT_EQ(sum(ones).item(), static_cast<double>(1 << 22));
  EXPECT_TRUE(std::isnan(max(Tensor::from_vector({1, NAN, 2}, Shape{3})).item())) << "NaN propagates";
}

TEST(Ops, SumToInvertsBroadcasting) {
  Tensor g = Tensor::ones(Shape{2, 3, 4}, DType::F64);
  EXPECT_EQ(v(sum_to(g, Shape{3, 1})), (std::vector<double>{8, 8, 8}));
  EXPECT_EQ(sum_to(g, Shape{1, 3, 4}).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(sum_to(g, Shape{}).item(), 24.0);
}

TEST(Ops, MatmulAndLinearMatchNaiveLoops) {
  for (DType dtype : {DType::F64, DType::F32}) {
    Tensor a = random_f64(Shape{2, 5, 7}, 5).to(dtype), b = random_f64(Shape{7, 3}, 6).to(dtype);
    Tensor c = matmul(a, b);
    ASSERT_EQ(c.shape(), (Shape{2, 5, 3}));
    std::vector<double> va = v(a), vb = v(b), vc = v(c), expect(30, 0.0);
    for (int i = 0; i < 10; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 7; ++k)
          expect[static_cast<size_t>(i * 3 + j)] +=
              va[static_cast<size_t>(i * 7 + k)] * vb[static_cast<size_t>(k * 3 + j)];
    EXPECT_TRUE(all_close(vc, expect, dtype == DType::F64 ? 1e-13 : 1e-5, 1e-6)) << dtype_name(dtype);
    Tensor w = random_f64(Shape{4, 7}, 7).to(dtype), bias = random_f64(Shape{4}, 8).to(dtype);
    Tensor y = linear(a, w, bias);
    Tensor expect_y = add(matmul(a, Tensor::from_vector(
                                        [&] {
                                          std::vector<double> wt(28), vw = v(w);
                                          for (int o = 0; o < 4; ++o)
                                            for (int i = 0; i < 7; ++i)
                                              wt[static_cast<size_t>(i * 4 + o)] = vw[static_cast<size_t>(o * 7 + i)];
                                          return wt;
                                        }(),
                                        Shape{7, 4}, dtype)),
                          bias);
    EXPECT_TRUE(all_close(y, expect_y, 1e-6, 1e-6));
  }
  EXPECT_THROW(linear(Tensor::ones(Shape{2, 3}), Tensor::ones(Shape{4, 5})), Error);
  EXPECT_THROW(matmul(Tensor::ones(Shape{3}), Tensor::ones(Shape{3, 2})), Error);
  // Empty inner dimension gives zeros.
  EXPECT_EQ(v(matmul(Tensor::ones(Shape{2, 0}), Tensor::ones(Shape{0, 2}))), std::vector<double>(4, 0.0));
  EXPECT_EQ(v(matmul(Tensor::ones(Shape{3, 2, 0}), Tensor::ones(Shape{0, 2}))), std::vector<double>(12, 0.0));
  EXPECT_EQ(v(linear(Tensor::ones(Shape{2, 0}), Tensor::ones(Shape{3, 0}), Tensor::ones(Shape{3}))),
            std::vector<double>(6, 1.0));
}

TEST(Ops, SixteenBitMatmulAccumulatesInF32) {
  for (DType dtype : {DType::F16, DType::BF16}) {
    Tensor a = Tensor::ones(Shape{4, 1024}, dtype), b = Tensor::ones(Shape{1024, 2}, dtype);
    EXPECT_EQ(v(matmul(a, b)), std::vector<double>(8, 1024.0)) << dtype_name(dtype);
  }
}

TEST(Ops, SoftmaxFamily) {
  Tensor x = Tensor::from_vector({1, 2, 3, 1000, 1000, 1000}, Shape{2, 3}, DType::F64);
  Tensor s = softmax(x);
  std::vector<double> vs = v(s);
  EXPECT_NEAR(vs[0] + vs[1] + vs[2], 1.0, 1e-15);
  EXPECT_NEAR(vs[3], 1.0 / 3, 1e-15) << "large logits are stable (max subtracted)";
  EXPECT_TRUE(all_close(v(exp(log_softmax(x))), vs, 1e-12, 1e-300));
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(v(log_softmax(x))[0], 1.0 - lse, 1e-15);
}

TEST(Ops, CrossEntropyValuesAndLabelErrors) {
  Tensor logits = Tensor::from_vector({0, 0, 0, 0}, Shape{2, 2}, DType::F64);
  Tensor labels = Tensor::from_vector({0, 1}, Shape{2}, DType::I64);
  EXPECT_NEAR(cross_entropy(logits, labels).item(), std::log(2.0), 1e-15);
  EXPECT_NEAR(cross_entropy(logits, labels.to(DType::I32), 0.3).item(), std::log(2.0), 1e-15);
  try {
    cross_entropy(logits, Tensor::from_vector({0, 2}, Shape{2}, DType::I64));
    FAIL() << "accepted label 2 for 2 classes";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("label 2 at row 1"), std::string::npos) << w;
    EXPECT_NE(w.find("[0, 2)"), std::string::npos) << w;
  }
  EXPECT_THROW(cross_entropy(logits, Tensor::from_vector({0, 1}, Shape{2}, DType::F32)), Error);
  EXPECT_THROW(cross_entropy(logits, labels, 1.5), Error);
  EXPECT_THROW(cross_entropy(Tensor::zeros(Shape{4}, DType::F64), labels), Error);
  // 16-bit logits give an f32 loss.
  EXPECT_EQ(cross_entropy(logits.to(DType::BF16), labels).dtype(), DType::F32);
}

TEST(Ops, DropoutScalesKeptValuesAndIsReproducible) {
  Tensor x = Tensor::ones(Shape{100000});
  Tensor y = dropout(x, 0.25, /*training=*/true, 9, 1);
  std::vector<double> vy = v(y);
  int kept = 0;
  for (double e : vy) {
    ASSERT_TRUE(e == 0.0 || std::abs(e - 1.0 / 0.75) < 1e-6) << e;
    kept += e != 0.0;
  }
  EXPECT_NEAR(kept / 100000.0, 0.75, 0.01);
  EXPECT_EQ(v(dropout(x, 0.25, true, 9, 1)), vy);
  EXPECT_NE(v(dropout(x, 0.25, true, 9, 2)), vy);
  EXPECT_TRUE(dropout(x, 0.25, /*training=*/false).shares_storage_with(x));
  EXPECT_THROW(dropout(x, 1.0, true), Error);
  manual_seed(5);
  std::vector<double> first = v(dropout(x, 0.5));
  manual_seed(5);
  EXPECT_EQ(v(dropout(x, 0.5)), first);
}

TEST(Ops, HalfPrecisionElementwise) {
  for (DType dtype : {DType::F16, DType::BF16}) {
    Tensor a = Tensor::from_vector({1, 2, 3, 4}, Shape{4}, dtype);
    EXPECT_EQ(v(add(a, a)), (std::vector<double>{2, 4, 6, 8})) << dtype_name(dtype);
    EXPECT_EQ(v(relu(neg(a))), (std::vector<double>{0, 0, 0, 0}));
    EXPECT_EQ(sum(a).item(), 10.0);
    EXPECT_NEAR(v(softmax(a))[3], std::exp(4.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0)),
                1e-2);
  }
}

TEST(Ops, MissingKernelIsAnErrorNamingTheOpAndDevice) {
  KernelTable empty_table;  // every entry null
  try {
    RT_KERNEL_FROM(empty_table, Device::cuda(1), "conv2d", gemm);
    FAIL();
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("op 'conv2d'"), std::string::npos) << w;
    EXPECT_NE(w.find("'gemm'"), std::string::npos) << w;
    EXPECT_NE(w.find("cuda:1"), std::string::npos) << w;
  }
  if (!cuda_available() && !RINGTRAIN_WITH_CUDA) {
    try {
      detail::kernel_table(Device::cuda(0), "softmax");
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("op 'softmax'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("without CUDA"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ringtrain
