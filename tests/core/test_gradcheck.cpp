// Finite-difference gradient checks (f64, CPU) for every op with a backward.
#include <gtest/gtest.h>

#include "core/ops.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::gradients_match;
using testing::random_f64;
using Inputs = std::vector<Tensor>;

struct GradCase {
  std::string name;
  std::function<Tensor(const Inputs&)> f;
  std::function<Inputs()> inputs;
};

Tensor positive(const Shape& s, uint64_t seed) { return random_f64(s, seed, 0.5, 2.0); }

std::vector<GradCase> cases() {
  return {
      {"add_broadcast", [](const Inputs& x) { return add(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{3, 4}, 1), random_f64(Shape{4}, 2)};
       }},
      {"sub_broadcast", [](const Inputs& x) { return sub(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{2, 1, 3}, 3), random_f64(Shape{4, 1}, 4)};
       }},
      {"mul_broadcast", [](const Inputs& x) { return mul(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{3, 4}, 5), random_f64(Shape{3, 1}, 6)};
       }},
      {"div_broadcast", [](const Inputs& x) { return div(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{3, 4}, 7), positive(Shape{4}, 8)};
       }},
      {"maximum", [](const Inputs& x) { return maximum(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{5}, 9), random_f64(Shape{5}, 10)};
       }},
      {"minimum", [](const Inputs& x) { return minimum(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{5}, 11), random_f64(Shape{5}, 12)};
       }},
      {"scalar_ops", [](const Inputs& x) { return rsub(mul(add(x[0], 1.5), 3.0), 2.0); },
       [] { return Inputs{random_f64(Shape{6}, 13)}; }},
      {"rdiv", [](const Inputs& x) { return rdiv(x[0], 2.0); }, [] { return Inputs{positive(Shape{6}, 14)}; }},
      {"pow", [](const Inputs& x) { return pow(x[0], 2.5); }, [] { return Inputs{positive(Shape{6}, 15)}; }},
      {"neg", [](const Inputs& x) { return neg(x[0]); }, [] { return Inputs{random_f64(Shape{4}, 16)}; }},
      {"relu", [](const Inputs& x) { return relu(x[0]); },
       [] {
         return Inputs{random_f64(Shape{3, 5}, 17)};
       }},
      {"exp", [](const Inputs& x) { return exp(x[0]); }, [] { return Inputs{random_f64(Shape{5}, 18)}; }},
      {"log", [](const Inputs& x) { return log(x[0]); }, [] { return Inputs{positive(Shape{5}, 19)}; }},
      {"sqrt", [](const Inputs& x) { return sqrt(x[0]); }, [] { return Inputs{positive(Shape{5}, 20)}; }},
      {"abs", [](const Inputs& x) { return abs(x[0]); }, [] { return Inputs{random_f64(Shape{5}, 21)}; }},
      {"tanh", [](const Inputs& x) { return tanh(x[0]); }, [] { return Inputs{random_f64(Shape{5}, 22)}; }},
      {"sigmoid", [](const Inputs& x) { return sigmoid(x[0]); }, [] { return Inputs{random_f64(Shape{5}, 23)}; }},
      {"sum_all", [](const Inputs& x) { return sum(x[0]); },
       [] {
         return Inputs{random_f64(Shape{2, 3}, 24)};
       }},
      {"sum_dim", [](const Inputs& x) { return sum(x[0], 1); },
       [] {
         return Inputs{random_f64(Shape{2, 3, 2}, 25)};
       }},
      {"sum_keepdim", [](const Inputs& x) { return sum(x[0], 0, true); },
       [] {
         return Inputs{random_f64(Shape{3, 2}, 26)};
       }},
      {"mean_all", [](const Inputs& x) { return mean(x[0]); },
       [] {
         return Inputs{random_f64(Shape{2, 3}, 27)};
       }},
      {"mean_dim", [](const Inputs& x) { return mean(x[0], -1); },
       [] {
         return Inputs{random_f64(Shape{3, 4}, 28)};
       }},
      {"max_all", [](const Inputs& x) { return max(x[0]); },
       [] {
         return Inputs{random_f64(Shape{3, 4}, 29)};
       }},
      {"max_dim", [](const Inputs& x) { return max(x[0], 1); },
       [] {
         return Inputs{random_f64(Shape{3, 4, 2}, 30)};
       }},
      {"matmul", [](const Inputs& x) { return matmul(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{3, 4}, 31), random_f64(Shape{4, 2}, 32)};
       }},
      {"matmul_leading_dims", [](const Inputs& x) { return matmul(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{2, 3, 4}, 33), random_f64(Shape{4, 2}, 34)};
       }},
      {"matmul_batched", [](const Inputs& x) { return matmul(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{2, 3, 4}, 35), random_f64(Shape{2, 4, 2}, 36)};
       }},
      {"linear", [](const Inputs& x) { return linear(x[0], x[1], x[2]); },
       [] {
         return Inputs{random_f64(Shape{2, 3, 4}, 37), random_f64(Shape{5, 4}, 38), random_f64(Shape{5}, 39)};
       }},
      {"linear_no_bias", [](const Inputs& x) { return linear(x[0], x[1]); },
       [] {
         return Inputs{random_f64(Shape{3, 4}, 40), random_f64(Shape{2, 4}, 41)};
       }},
      {"softmax", [](const Inputs& x) { return softmax(x[0]); },
       [] {
         return Inputs{random_f64(Shape{3, 5}, 42)};
       }},
      {"log_softmax", [](const Inputs& x) { return log_softmax(x[0]); },
       [] {
         return Inputs{random_f64(Shape{3, 5}, 43)};
       }},
      {"cross_entropy_smoothing",
       [](const Inputs& x) {
         return cross_entropy(x[0], Tensor::from_vector({2, 0, 4, 1}, Shape{4}, DType::I64), 0.2);
       },
       [] {
         return Inputs{random_f64(Shape{4, 5}, 44, -3, 3)};
       }},
      {"cross_entropy_scaled_upstream",
       [](const Inputs& x) {
         return mul(cross_entropy(x[0], Tensor::from_vector({1, 0}, Shape{2}, DType::I32)), 3.0);
       },
       [] {
         return Inputs{random_f64(Shape{2, 3}, 45)};
       }},
      {"dropout", [](const Inputs& x) { return dropout(x[0], 0.3, true, 77, 5); },
       [] {
         return Inputs{random_f64(Shape{4, 5}, 46)};
       }},
      {"views", [](const Inputs& x) { return x[0].slice(1, 3).reshape(Shape{-1}).flatten(); },
       [] {
         return Inputs{random_f64(Shape{4, 3}, 47)};
       }},
      {"conv2d_padded_bias", [](const Inputs& x) { return conv2d(x[0], x[1], x[2], {.pad_h = 1, .pad_w = 1}); },
       [] {
         return Inputs{random_f64(Shape{2, 4, 3, 3}, 50), random_f64(Shape{2, 3, 3, 3}, 51), random_f64(Shape{2}, 52)};
       }},
      {"conv2d_strided_dilated_grouped",
       [](const Inputs& x) {
         return conv2d(
             x[0], x[1], Tensor(),
             {.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 2, .dilation_h = 1, .dilation_w = 2, .groups = 2});
       },
       [] {
         return Inputs{random_f64(Shape{1, 5, 4, 4}, 53), random_f64(Shape{4, 2, 3, 2}, 54)};
       }},
      {"batch_norm_training",
       [](const Inputs& x) {
         return batch_norm(x[0], x[1], x[2], Tensor::zeros(Shape{3}, DType::F64), Tensor::ones(Shape{3}, DType::F64),
                           true, 0.1, 1e-5);
       },
       [] {
         return Inputs{random_f64(Shape{2, 3, 2, 3}, 55), random_f64(Shape{3}, 56), random_f64(Shape{3}, 57)};
       }},
      {"batch_norm_eval_relu",
       [](const Inputs& x) {
         return batch_norm(x[0], x[1], x[2], Tensor::full(Shape{2}, 0.1, DType::F64),
                           Tensor::full(Shape{2}, 2.0, DType::F64), false, 0.1, 1e-5, true);
       },
       [] {
         return Inputs{random_f64(Shape{2, 2, 2, 2}, 58), random_f64(Shape{2}, 59), random_f64(Shape{2}, 60)};
       }},
      {"batch_norm_add_relu",
       [](const Inputs& x) {
         return batch_norm(x[0], x[1], x[2], Tensor::zeros(Shape{3}, DType::F64), Tensor::ones(Shape{3}, DType::F64),
                           true, 0.1, 1e-5, true, x[3]);
       },
       [] {
         return Inputs{random_f64(Shape{2, 2, 2, 3}, 64), random_f64(Shape{3}, 65), random_f64(Shape{3}, 66),
                       random_f64(Shape{2, 2, 2, 3}, 67)};
       }},
      {"max_pool2d",
       [](const Inputs& x) {
         return max_pool2d(x[0], {3, 3, 2, 2, 1, 1});
       },
       [] {
         return Inputs{random_f64(Shape{2, 5, 4, 2}, 61)};
       }},
      {"avg_pool2d",
       [](const Inputs& x) {
         return avg_pool2d(x[0], {3, 2, 2, 1, 1, 1});
       },
       [] {
         return Inputs{random_f64(Shape{1, 5, 4, 3}, 62)};
       }},
      {"global_avg_pool", [](const Inputs& x) { return global_avg_pool(x[0]); },
       [] {
         return Inputs{random_f64(Shape{2, 3, 2, 4}, 63)};
       }},
      {"clone", [](const Inputs& x) { return mul(x[0].clone(), x[0]); },
       [] { return Inputs{random_f64(Shape{3}, 48)}; }},
      // ---- the pieces of today's CNNs (core/ops_tensor.cpp, core/ops_nn.cpp): odd sizes, one-element dims
      {"cat",
       [](const Inputs& x) {
         return cat({x[0], x[1], x[2]}, -2);
       },
       [] {
         return Inputs{random_f64(Shape{2, 3, 1}, 70), random_f64(Shape{2, 1, 1}, 71), random_f64(Shape{2, 2, 1}, 72)};
       }},
      {"split_chunk_narrow_select",
       [](const Inputs& x) {
         const std::vector<Tensor> p = split(x[0], 2, 1), c = chunk(x[0], 2, 2);  // (2,2,3) (2,1,3); (2,3,2) (2,3,1)
         return add(add(mul(p[1], narrow(x[0], 1, 1, 1)), sum(c[0], 2, true)), mul(select(x[0], 0, 1), 2.0));
       },
       [] {
         return Inputs{random_f64(Shape{2, 3, 3}, 73)};
       }},
      {"permute_transpose",
       [](const Inputs& x) {
         return mul(permute(x[0], {3, 1, 0, 2}), transpose(transpose(permute(x[0], {3, 1, 0, 2}), 0, 3), 3, 0));
       },
       [] {
         return Inputs{random_f64(Shape{2, 1, 3, 4}, 74)};
       }},
      {"expand",
       [](const Inputs& x) {
         return expand(x[0], Shape{2, 3, 4});
       },
       [] {
         return Inputs{random_f64(Shape{3, 1}, 75)};
       }},
      {"where",
       [](const Inputs& x) {
         return where(gt(random_f64(Shape{3, 1}, 76), Tensor::zeros(Shape{}, DType::F64)), x[0], x[1]);
       },
       [] {
         return Inputs{random_f64(Shape{3, 4}, 77), random_f64(Shape{4}, 78)};
       }},
      {"clamp", [](const Inputs& x) { return clamp(x[0], -0.3, 0.4); },
       [] { return Inputs{random_f64(Shape{7}, 79)}; }},
      {"clamp_min", [](const Inputs& x) { return clamp(x[0], 0.1, std::nullopt); },
       [] { return Inputs{random_f64(Shape{7}, 80)}; }},
      {"hardtanh", [](const Inputs& x) { return hardtanh(x[0], -0.5, 0.5); },
       [] { return Inputs{random_f64(Shape{7}, 81)}; }},
      {"relu6", [](const Inputs& x) { return relu6(x[0]); }, [] { return Inputs{random_f64(Shape{9}, 82, -2, 8)}; }},
      {"leaky_relu", [](const Inputs& x) { return leaky_relu(x[0], 0.1); },
       [] { return Inputs{random_f64(Shape{7}, 83)}; }},
      {"gelu", [](const Inputs& x) { return gelu(x[0]); }, [] { return Inputs{random_f64(Shape{9}, 84, -4, 4)}; }},
      {"gelu_tanh", [](const Inputs& x) { return gelu(x[0], GeluApproximation::Tanh); },
       [] { return Inputs{random_f64(Shape{9}, 85, -4, 4)}; }},
      {"silu", [](const Inputs& x) { return silu(x[0]); }, [] { return Inputs{random_f64(Shape{9}, 86, -5, 5)}; }},
      {"hardswish", [](const Inputs& x) { return hardswish(x[0]); },
       [] { return Inputs{random_f64(Shape{9}, 87, -5, 5)}; }},
      {"hardsigmoid", [](const Inputs& x) { return hardsigmoid(x[0]); },
       [] { return Inputs{random_f64(Shape{9}, 88, -5, 5)}; }},
      {"layer_norm", [](const Inputs& x) { return layer_norm(x[0], x[1], x[2]); },
       [] {
         return Inputs{random_f64(Shape{2, 1, 3, 5}, 89), random_f64(Shape{5}, 90), random_f64(Shape{5}, 91)};
       }},
      {"layer_norm_plain", [](const Inputs& x) { return layer_norm(x[0], {}, {}, 1e-3); },
       [] {
         return Inputs{random_f64(Shape{3, 4}, 92)};
       }},
      {"group_norm", [](const Inputs& x) { return group_norm(x[0], 2, x[1], x[2]); },
       [] {
         return Inputs{random_f64(Shape{2, 3, 1, 6}, 93), random_f64(Shape{6}, 94), random_f64(Shape{6}, 95)};
       }},
      {"group_norm_per_channel", [](const Inputs& x) { return group_norm(x[0], 3, {}, {}); },
       [] {
         return Inputs{random_f64(Shape{1, 2, 3, 3}, 96)};
       }},
      {"adaptive_avg_pool2d", [](const Inputs& x) { return adaptive_avg_pool2d(x[0], 3, 2); },
       [] {
         return Inputs{random_f64(Shape{2, 5, 3, 2}, 97)};
       }},
      {"adaptive_avg_pool2d_up", [](const Inputs& x) { return adaptive_avg_pool2d(x[0], 4, 5); },
       [] {
         return Inputs{random_f64(Shape{1, 3, 2, 2}, 98)};
       }},
      {"upsample_nearest", [](const Inputs& x) { return upsample(x[0], {.out_h = 5, .out_w = 7}); },
       [] {
         return Inputs{random_f64(Shape{2, 3, 2, 2}, 99)};
       }},
      {"upsample_bilinear",
       [](const Inputs& x) { return upsample(x[0], {.out_h = 5, .out_w = 7, .mode = UpsampleMode::Bilinear}); },
       [] {
         return Inputs{random_f64(Shape{2, 3, 2, 2}, 100)};
       }},
      {"upsample_bilinear_corners",
       [](const Inputs& x) {
         return upsample(x[0], {.scale_h = 2, .scale_w = 1.5, .mode = UpsampleMode::Bilinear, .align_corners = true});
       },
       [] {
         return Inputs{random_f64(Shape{1, 3, 4, 2}, 101)};
       }},
      {"conv_transpose2d",
       [](const Inputs& x) {
         return conv_transpose2d(
             x[0], x[1], x[2], {.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 0, .output_pad_h = 1, .groups = 2});
       },
       [] {
         return Inputs{random_f64(Shape{2, 3, 2, 4}, 102), random_f64(Shape{4, 3, 2, 3}, 103),
                       random_f64(Shape{6}, 104)};
       }},
      {"conv_transpose2d_dilated",
       [](const Inputs& x) {
         return conv_transpose2d(x[0], x[1], Tensor(),
                                 {.stride_h = 2, .stride_w = 2, .dilation_h = 2, .dilation_w = 1});
       },
       [] {
         return Inputs{random_f64(Shape{1, 2, 3, 2}, 105), random_f64(Shape{2, 2, 2, 3}, 106)};
       }},
      {"drop_path", [](const Inputs& x) { return drop_path(x[0], 0.4, true, 11, 3, 5); },
       [] {
         return Inputs{random_f64(Shape{6, 2, 1, 2}, 107)};
       }},
      {"cross_entropy_pixels_weighted",
       [](const Inputs& x) {
         const Tensor labels = Tensor::from_vector({0, 2, 9, 1, 1, 2}, Shape{1, 2, 3}, DType::I64);
         return cross_entropy(x[0], labels,
                              {.label_smoothing = 0.1,
                               .ignore_index = 9,
                               .weight = Tensor::from_vector({0.5, 2.0, 1.25}, Shape{3}, DType::F64)});
       },
       [] {
         return Inputs{random_f64(Shape{1, 2, 3, 3}, 108, -2, 2)};
       }},
  };
}

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class GradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradCheck, MatchesCentralDifferences) {
  const GradCase& c = GetParam();
  EXPECT_TRUE(gradients_match(c.f, c.inputs()));
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

TEST(GradCheckSelfTest, DetectsAWrongGradient) {
  // The checker must fail for a deliberately wrong backward: out = x * 2 with backward claiming x * 3.
  auto wrong = [](const Inputs& x) {
    Tensor out = mul(x[0], 2.0);
    Tensor fake = mul(x[0], 3.0);
    // fake's value is replaced by out's via a zero-gradient trick: fake + (out - fake).detach()
    return add(fake, sub(out, fake).detach());
  };
  EXPECT_FALSE(gradients_match(wrong, Inputs{random_f64(Shape{3}, 49)}));
}

}  // namespace
}  // namespace ringtrain
