// cuDNN convolution (core/cuda/conv.cpp) agrees with the CPU convolution, forward and backward (input,
// filter and bias gradients), for the geometries ResNets use and the unusual ones (groups, dilation,
// odd sizes), in every floating dtype. Every test skips with the reason when there is no CUDA device.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "core/check.h"
#include "core/device.h"
#include "core/ops.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;

const Device kGpu = Device::cuda(0);

struct ConvCase {
  std::string name;
  Shape x, w;  // (N, H, W, C), (K, R, S, C / groups)
  Conv2dParams params;
  bool bias = false;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"3x3_pad1", Shape{2, 9, 9, 4}, Shape{8, 3, 3, 4}, {.pad_h = 1, .pad_w = 1}},
      {"3x3_stride2_bias",
       Shape{3, 11, 10, 5},
       Shape{6, 3, 3, 5},
       {.stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
       true},
      {"1x1_stride2_downsample", Shape{2, 8, 8, 16}, Shape{32, 1, 1, 16}, {.stride_h = 2, .stride_w = 2}},
      {"7x7_stride2_stem",
       Shape{2, 32, 32, 3},
       Shape{16, 7, 7, 3},
       {.stride_h = 2, .stride_w = 2, .pad_h = 3, .pad_w = 3}},
      {"grouped", Shape{2, 7, 7, 8}, Shape{12, 3, 3, 4}, {.pad_h = 1, .pad_w = 1, .groups = 2}, true},
      {"depthwise", Shape{2, 6, 6, 8}, Shape{8, 3, 3, 1}, {.pad_h = 1, .pad_w = 1, .groups = 8}},
      {"dilated_asymmetric",
       Shape{1, 12, 9, 3},
       Shape{4, 3, 2, 3},
       {.stride_h = 1, .stride_w = 2, .pad_h = 2, .pad_w = 1, .dilation_h = 2, .dilation_w = 1}},
  };
}

double tolerance(DType t) {
  switch (t) {
    case DType::F64:
      return 1e-10;
    case DType::F32:
      return 2e-5;  // TF32 is switched off below
    case DType::F16:
      return 5e-3;
    case DType::BF16:
      return 3e-2;
    default:
      return 0;
  }
}

class CudaConv : public ::testing::TestWithParam<std::tuple<ConvCase, DType>> {
 protected:
  void SetUp() override { set_allow_tf32(false); }
  void TearDown() override { set_allow_tf32(true); }
};

TEST_P(CudaConv, ForwardAndBackwardAgreeWithTheCpu) {
  RT_REQUIRE_CUDA();
  const auto& [c, dtype] = GetParam();
  const int64_t k = c.w[0];
  Tensor x = Tensor::uniform(c.x, -1, 1, 11, DType::F64).to(dtype);
  Tensor w = Tensor::uniform(c.w, -0.5, 0.5, 12, DType::F64).to(dtype);
  Tensor b = c.bias ? Tensor::uniform(Shape{k}, -0.5, 0.5, 13, DType::F64).to(dtype) : Tensor();
  auto run = [&](Device device) {
    Tensor xd = x.to(device).clone().set_requires_grad(), wd = w.to(device).clone().set_requires_grad();
    Tensor bd = c.bias ? b.to(device).clone().set_requires_grad() : Tensor();
    Tensor y = conv2d(xd, wd, bd, c.params);
    // A non-uniform upstream gradient, so that every output position matters.
    Tensor g = Tensor::uniform(y.shape(), -1, 1, 14, DType::F64).to(dtype).to(device);
    sum(mul(y, g)).backward();
    std::vector<Tensor> out{y.to(Device::cpu()), xd.grad().to(Device::cpu()), wd.grad().to(Device::cpu())};
    if (c.bias) out.push_back(bd.grad().to(Device::cpu()));
    return out;
  };
  const auto cpu = run(Device::cpu()), gpu = run(kGpu);
  const double tol = tolerance(dtype) * std::sqrt(static_cast<double>(c.w[1] * c.w[2] * c.w[3]));
  const char* names[] = {"output", "input gradient", "filter gradient", "bias gradient"};
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_TRUE(all_close(gpu[i], cpu[i], tol, tol)) << c.name << " " << dtype_name(dtype) << ": " << names[i];
}

INSTANTIATE_TEST_SUITE_P(Geometries, CudaConv,
                         ::testing::Combine(::testing::ValuesIn(conv_cases()),
                                            ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::F64)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::string(dtype_name(std::get<1>(info.param)));
                         });

TEST(CudaConvMisc, AlgorithmsAreChosenOncePerShapeAndReported) {
  RT_REQUIRE_CUDA();
  Tensor x = Tensor::uniform(Shape{4, 14, 14, 32}, -1, 1, 1).to(kGpu);
  Tensor w = Tensor::uniform(Shape{32, 3, 3, 32}, -1, 1, 2).to(kGpu);
  Tensor y1 = conv2d(x, w, Tensor(), {.pad_h = 1, .pad_w = 1});
  const size_t after_first = cuda_conv_algorithms().size();
  Tensor y2 = conv2d(x, w, Tensor(), {.pad_h = 1, .pad_w = 1});
  EXPECT_EQ(cuda_conv_algorithms().size(), after_first) << "the second call must reuse the cached choice";
  EXPECT_TRUE(all_close(y2.to(Device::cpu()), y1.to(Device::cpu()), 0, 0)) << "same algorithm, same result";
  bool found = false;
  for (const std::string& line : cuda_conv_algorithms())
    found |= line.find("forward cuda:0 N4 H14 W14 C32 K32 3x3") != std::string::npos;
  EXPECT_TRUE(found) << "the report names the shape";
}

TEST(CudaConvMisc, IntegerInputIsRefusedNamingTheDtype) {
  RT_REQUIRE_CUDA();
  Tensor x = Tensor::zeros(Shape{1, 4, 4, 2}, DType::I32, kGpu), w = Tensor::zeros(Shape{2, 3, 3, 2}, DType::I32, kGpu);
  try {
    conv2d(x, w, Tensor(), {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d"), std::string::npos) << e.what();
  }
}

TEST(CudaConvMisc, CpuBuildReportsNoAlgorithms) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: covered by the tests above";
  EXPECT_TRUE(cuda_conv_algorithms().empty());
}

}  // namespace
}  // namespace ringtrain
