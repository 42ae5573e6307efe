// Today's CNNs (layers/models/): torchvision's MobileNetV2, EfficientNet-B0 and ConvNeXt-Tiny and the UNet (batch
// norm and GroupNorm) against PyTorch in f64 with weights from a formula both sides evaluate (tests/golden/
// models.json): the state dicts' names, order and shapes (the formula depends on them), training-mode logits, loss,
// gradients and running statistics, eval-mode logits. Then what every model promises the runtime: its blocks()
// compose to its forward, bit for bit; recompute gives the same gradients, bit for bit; parameter counts as
// torchvision's; errors for inputs it cannot take.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "layers/deterministic_state.h"
#include "layers/loss.h"
#include "layers/model_state.h"
#include "layers/models/convnext.h"
#include "layers/models/efficientnet.h"
#include "layers/models/mobilenet.h"
#include "layers/models/unet.h"
#include "layers/models/zoo.h"
#include "layers/recompute.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;
using testing::deterministic_state;
using testing::error_of;
using testing::load_golden;

struct Case {
  std::string arch;
  int64_t hw, classes;
  bool segmentation;
  std::vector<std::string> watched;
  std::string running;  // a batch norm whose running mean the golden has, or ""
};

std::shared_ptr<Module> make_f64(const Case& c) {
  // Dropout and stochastic depth off, as the golden's PyTorch models.
  if (c.arch == "mobilenet_v2")
    return std::make_shared<MobileNetV2>(
        MobileNetV2Options{.num_classes = c.classes, .dropout = 0, .dtype = DType::F64});
  if (c.arch == "efficientnet_b0")
    return std::make_shared<EfficientNet>(
        EfficientNetOptions{.num_classes = c.classes, .stochastic_depth = 0, .dropout = 0, .dtype = DType::F64});
  if (c.arch == "convnext_tiny")
    return std::make_shared<ConvNeXt>(
        ConvNeXtOptions{.num_classes = c.classes, .stochastic_depth = 0, .dtype = DType::F64});
  return std::make_shared<UNet>(UNetOptions{
      .num_classes = c.classes, .width = 8, .depth = 3, .groups = c.arch == "unet_gn" ? 4 : 0, .dtype = DType::F64});
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c{
      {"mobilenet_v2",
       64,
       7,
       false,
       {"features.0.0.weight", "features.5.conv.1.1.weight", "classifier.1.weight"},
       "features.0.1.running_mean"},
      {"efficientnet_b0",
       64,
       7,
       false,
       {"features.0.0.weight", "features.3.1.block.2.fc1.weight", "classifier.1.bias"},
       "features.2.0.block.1.1.running_mean"},
      {"convnext_tiny",
       32,
       7,
       false,
       {"features.0.0.weight", "features.5.4.layer_scale", "features.5.4.block.2.weight", "classifier.2.weight"},
       ""},
      {"unet",
       16,
       4,
       true,
       {"inc.double_conv.0.weight", "up2.up.weight", "up3.conv.double_conv.4.bias", "outc.conv.bias"},
       "inc.double_conv.1.running_mean"},
      {"unet_gn",
       16,
       4,
       true,
       {"inc.double_conv.0.weight", "down3.maxpool_conv.1.double_conv.1.weight", "up1.up.bias"},
       ""},
  };
  return c;
}

Tensor golden_input(int64_t hw, DType dtype = DType::F64) {
  std::vector<double> xs(static_cast<size_t>(2 * hw * hw * 3));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.05 * static_cast<double>(i));
  return Tensor::from_vector(xs, Shape{2, hw, hw, 3}, dtype);
}

Tensor golden_labels(const Case& c) {
  if (!c.segmentation) return Tensor::from_vector({1, static_cast<double>(c.classes - 1)}, Shape{2}, DType::I64);
  std::vector<double> v(static_cast<size_t>(2 * c.hw * c.hw));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % static_cast<size_t>(c.classes));
  v[static_cast<size_t>(3 * c.hw + 5)] = 255;  // labels[0, 3, 5]
  return Tensor::from_vector(v, Shape{2, c.hw, c.hw}, DType::I64);
}

// Against the largest expected magnitude, not per element: gradients are sums over many products, and train-mode
// batch norm over 2 images at the last 2x2 positions amplifies f64 rounding (PyTorch's and ringtrain's sums run in
// other orders) to ~1e-8 of the scale there; a semantic difference shows at 1e-3 or more.
::testing::AssertionResult close_to_scale(const Tensor& actual, const Tensor& expected, double fraction) {
  double scale = 0;
  for (double e : expected.to_vector()) scale = std::max(scale, std::abs(e));
  return all_close(actual.to(DType::F64), expected, 0.0, fraction * scale);
}

class ModelGolden : public ::testing::TestWithParam<Case> {};

TEST_P(ModelGolden, MatchesPyTorchInF64) {
  const Case& c = GetParam();
  auto g = load_golden("models");
  std::shared_ptr<Module> model = make_f64(c);
  deterministic_state(*model);
  const Tensor x = golden_input(c.hw);
  model->train();
  Tensor logits = (*model)(x);
  EXPECT_TRUE(close_to_scale(logits, g.at(c.arch + "_logits"), 1e-8)) << c.arch;
  const Tensor loss = c.segmentation ? CrossEntropyLoss({.ignore_index = 255})(logits, golden_labels(c))
                                     : CrossEntropyLoss(0.1)(logits, golden_labels(c));
  EXPECT_NEAR(loss.item(), g.at(c.arch + "_loss").item(), 1e-9) << c.arch;
  loss.backward();
  std::map<std::string, Tensor> params, buffers;
  for (auto& [n, t] : model->named_parameters()) params[n] = t;
  for (auto& [n, t] : model->named_buffers()) buffers[n] = t;
  for (const std::string& name : c.watched) {
    ASSERT_TRUE(params.count(name)) << c.arch << ": no parameter " << name;
    EXPECT_TRUE(close_to_scale(params.at(name).grad(), g.at(c.arch + "_grad_" + name), 1e-6)) << c.arch << " " << name;
  }
  if (!c.running.empty()) {
    EXPECT_TRUE(close_to_scale(buffers.at(c.running), g.at(c.arch + "_running_mean"), 1e-10)) << c.arch;
  }
  model->eval();
  NoGradGuard no_grad;
  EXPECT_TRUE(close_to_scale((*model)(x), g.at(c.arch + "_eval_logits"), 1e-8)) << c.arch << " eval";
}

INSTANTIATE_TEST_SUITE_P(Models, ModelGolden, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.arch; });

TEST(Models, ParameterCountsAndNamesMatchTorchvision) {
  // torchvision.models.<arch>(num_classes=1000): sum of p.numel() over parameters, and the state dict's size.
  const std::map<std::string, std::pair<int64_t, size_t>> expected{
      {"mobilenet_v2", {3504872, 314}}, {"efficientnet_b0", {5288548, 360}}, {"convnext_tiny", {28589128, 182}}};
  for (const auto& [arch, want] : expected) {
    std::shared_ptr<Module> m = make_model(arch, {});
    EXPECT_EQ(m->num_parameters(), want.first) << arch;
    EXPECT_EQ(m->state_dict().size(), want.second) << arch;
  }
  std::set<std::string> names;
  for (auto& [n, t] : make_model("convnext_tiny", {})->state_dict()) names.insert(n);
  for (const char* n : {"features.1.0.block.0.weight", "features.1.0.block.2.weight", "features.1.0.block.3.bias",
                        "features.1.0.block.5.weight", "features.1.0.layer_scale", "features.2.0.weight",
                        "features.2.1.weight", "classifier.0.weight", "classifier.2.bias"})
    EXPECT_TRUE(names.count(n)) << n;
}

// Every model of the zoo on a small input: its blocks() compose to its forward bit for bit (training mode: the
// dropout and stochastic depth draws come in the same order), and recompute gives the plain run's gradients.
void check_blocks_and_recompute(const std::string& arch, int64_t side, int64_t classes) {
  manual_seed(21);
  std::shared_ptr<Module> model = make_model(arch, {.in_channels = 3, .num_classes = classes});
  const Tensor x = Tensor::normal(Shape{4, side, side, 3}, 0, 1, 5);
  model->train();
  const std::vector<Block> blocks = model->blocks();
  ASSERT_GT(blocks.size(), 3u) << arch;
  Tensor direct, chained = x;
  {
    ModelStateGuard untouched(*model);
    set_rng_stream(1000);
    direct = (*model)(x);
  }
  {
    ModelStateGuard untouched(*model);
    set_rng_stream(1000);
    for (const Block& b : blocks) chained = b.forward(chained);
  }
  EXPECT_EQ(chained.shape(), direct.shape()) << arch;
  EXPECT_EQ(chained.to_vector(), direct.to_vector()) << arch << ": blocks() do not compose to forward()";
  // Recompute: the same loss and gradients, bit for bit.
  const Tensor labels = model_info(arch).segmentation
                            ? Tensor::from_vector(std::vector<double>(static_cast<size_t>(4 * side * side), 1.0),
                                                  Shape{4, side, side}, DType::I64)
                            : Tensor::from_vector({0, 1, 2, 1}, Shape{4}, DType::I64);
  auto gradients = [&](bool recompute) {
    ModelStateGuard untouched(*model);
    EXPECT_EQ(recompute_blocks(*model, recompute) > 0, recompute) << arch;
    set_rng_stream(2000);
    cross_entropy((*model)(x), labels).backward();
    std::vector<std::vector<double>> g;
    for (const Tensor& p : model->parameters())
      g.push_back(p.grad().defined() ? p.grad().to_vector() : std::vector<double>{});
    return g;
  };
  const auto plain = gradients(false), recomputed = gradients(true);
  recompute_blocks(*model, false);
  ASSERT_EQ(plain.size(), recomputed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], recomputed[i]) << arch << " parameter " << i;
}

TEST(Models, MobileNetV2BlocksAndRecompute) { check_blocks_and_recompute("mobilenet_v2", 32, 10); }
TEST(Models, EfficientNetB0BlocksAndRecompute) { check_blocks_and_recompute("efficientnet_b0", 32, 10); }
TEST(Models, ConvNeXtTinyBlocksAndRecompute) { check_blocks_and_recompute("convnext_tiny", 32, 10); }
TEST(Models, UNetBlocksAndRecompute) { check_blocks_and_recompute("unet", 16, 3); }
TEST(Models, UNetGroupNormBlocksAndRecompute) { check_blocks_and_recompute("unet_gn", 16, 3); }

TEST(Models, SpaceToDepthIsInvertedByDepthToSpace) {
  const Tensor x = Tensor::normal(Shape{2, 8, 4, 3}, 0, 1, 3);
  const Tensor s = space_to_depth(x, 4);
  EXPECT_EQ(s.shape(), (Shape{2, 2, 1, 48}));
  EXPECT_EQ(depth_to_space(s, 4).to_vector(), x.to_vector());
  // Pixel (1, 2) of image 0 lands in patch (0, 0) at channel offset ((1 * 4) + 2) * 3.
  EXPECT_EQ(s.to_vector()[static_cast<size_t>(6 * 3)], x.to_vector()[static_cast<size_t>((1 * 4 + 2) * 3)]);
}

TEST(Models, ZooNamesEveryModelAndRefusesWhatItCannotTake) {
  for (const char* arch :
       {"resnet20", "resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_tiny", "unet", "unet_gn"})
    EXPECT_NO_THROW(model_info(arch)) << arch;
  EXPECT_NE(error_of([] {
              model_info("mobilenet_v3");
            }).find("unknown architecture 'mobilenet_v3' (expected one of resnet20"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              (*make_model("convnext_tiny", {.num_classes = 3}))(Tensor::zeros(Shape{1, 28, 28, 3}));
            }).find("smaller than the 32x32"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              (*make_model("unet", {.num_classes = 3}))(Tensor::zeros(Shape{1, 20, 16, 3}));
            }).find("H and W multiples of 8"),
            std::string::npos);
  // One-channel images (Fashion-MNIST) and any class count.
  auto m = make_model("mobilenet_v2", {.in_channels = 1, .num_classes = 10});
  m->eval();
  EXPECT_EQ((*m)(Tensor::zeros(Shape{2, 28, 28, 1})).shape(), (Shape{2, 10}));
  auto u = make_model("unet", {.in_channels = 1, .num_classes = 5});
  u->eval();
  EXPECT_EQ((*u)(Tensor::zeros(Shape{1, 32, 24, 1})).shape(), (Shape{1, 32, 24, 5}));
}

}  // namespace
}  // namespace ringtrain
