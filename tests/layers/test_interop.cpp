// PyTorch interop: torchvision ResNet-18 and a CIFAR ResNet-20, initialised by PyTorch and exported by
// scripts/torch_interop.py (export-golden, run by CTest first), load into ringtrain's ResNets and
// reproduce PyTorch's logits, loss and gradients on a fixed input (f32). Skips, with the reason, when
// the export is not there (no python3-torch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/ops.h"
#include "io/checkpoint.h"
#include "layers/loss.h"
#include "layers/models/convnext.h"
#include "layers/models/efficientnet.h"
#include "layers/models/mobilenet.h"
#include "layers/models/resnet.h"
#include "layers/models/unet.h"
#include "test_util.h"

namespace ringtrain {
namespace {
namespace fs = std::filesystem;

// Gradients are sums over thousands of products: compare with an absolute tolerance scaled to the
// largest expected magnitude, not per element (near-zero entries come from cancellation).
::testing::AssertionResult close_to_scale(const std::vector<double>& actual, const std::vector<double>& expected,
                                          double fraction) {
  double scale = 0;
  for (double e : expected) scale = std::max(scale, std::abs(e));
  return testing::all_close(actual, expected, 0.0, fraction * scale);
}

// conv1_fraction: the first layer's gradient passes back through every layer; for ResNet-20 at PyTorch's
// default init, PyTorch's own f32 and f64 results already differ there by 1.1% of the largest entry.
void check_interop(const std::string& arch, int64_t hw, double conv1_fraction) {
  const char* dir_env = std::getenv("RINGTRAIN_INTEROP_DIR");
  if (!dir_env) GTEST_SKIP() << "RINGTRAIN_INTEROP_DIR not set (run through ctest, which exports the weights)";
  const fs::path dir(dir_env);
  if (!fs::exists(dir / (arch + ".h5")))
    GTEST_SKIP() << "no PyTorch export in " << dir << " (scripts/torch_interop.py export-golden needs python3-torch)";
  Checkpoint c = load_checkpoint(dir / (arch + ".h5"));
  ResNet model(arch, {.num_classes = 10});
  model.load_state_dict(c.model);
  nlohmann::json expected = nlohmann::json::parse(std::ifstream(dir / (arch + "_expected.json")));
  std::vector<double> xs(static_cast<size_t>(4 * hw * hw * 3));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.05 * static_cast<double>(i));
  Tensor x = Tensor::from_vector(xs, Shape{4, hw, hw, 3});  // rounded to f32 once, like the export
  Tensor labels = Tensor::from_vector({0, 3, 5, 9}, Shape{4}, DType::I64);
  model.train();
  Tensor logits = model(x);
  EXPECT_TRUE(close_to_scale(logits.to_vector(), expected["logits"].get<std::vector<double>>(), 1e-3)) << arch;
  Tensor loss = CrossEntropyLoss()(logits, labels);
  EXPECT_NEAR(loss.item(), expected["loss"].get<double>(), 1e-4);
  loss.backward();
  std::map<std::string, Tensor> p;
  for (auto& [n, t] : model.named_parameters()) p[n] = t;
  EXPECT_TRUE(
      close_to_scale(p.at("fc.weight").grad().to_vector(), expected["grad_fc_weight"].get<std::vector<double>>(), 1e-3))
      << arch;
  EXPECT_TRUE(close_to_scale(p.at("conv1.weight").grad().to_vector(),
                             expected["grad_conv1_weight"].get<std::vector<double>>(), conv1_fraction))
      << arch;
}

TEST(Interop, TorchvisionResNet18WeightsReproducePyTorch) { check_interop("resnet18", 64, 1e-3); }
TEST(Interop, ResNet20WeightsReproducePyTorch) { check_interop("resnet20", 32, 2.5e-2); }

// ---------------------------------------------------------------------------------------------------
// Today's CNNs: torchvision's MobileNetV2, EfficientNet-B0 and ConvNeXt-Tiny and the UNet, PyTorch-initialised and
// exported by torch_interop.py, load into ringtrain's models and reproduce PyTorch's f32 logits within 1e-4 and the
// watched parameters' gradients within 1e-3 of their scale, in training mode and then in eval mode (which reads the
// running statistics the training pass moved). Where PyTorch's own f32 pass lies further than that from its f64
// pass (MobileNetV2 in training: its ReLU6 saturates at init, and f32 rounding moves its first layer's gradient by
// percents), twice that distance is the bound: no f32 implementation is closer to PyTorch's f32 than that.
// (tests/layers/test_models.cpp holds every family to PyTorch in f64, to 1e-8.)

struct Family {
  std::string arch;
  int64_t hw, classes;
  bool segmentation;
};

std::shared_ptr<Module> family_model(const Family& f) {
  // Dropout and stochastic depth off, as the export's.
  if (f.arch == "mobilenet_v2")
    return std::make_shared<MobileNetV2>(MobileNetV2Options{.num_classes = f.classes, .dropout = 0});
  if (f.arch == "efficientnet_b0")
    return std::make_shared<EfficientNet>(
        EfficientNetOptions{.num_classes = f.classes, .stochastic_depth = 0, .dropout = 0});
  if (f.arch == "convnext_tiny")
    return std::make_shared<ConvNeXt>(ConvNeXtOptions{.num_classes = f.classes, .stochastic_depth = 0});
  return std::make_shared<UNet>(UNetOptions{.num_classes = f.classes});
}

Tensor family_input(int64_t hw) {
  std::vector<double> xs(static_cast<size_t>(4 * hw * hw * 3));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.05 * static_cast<double>(i));
  return Tensor::from_vector(xs, Shape{4, hw, hw, 3});  // rounded to f32 once, like the export
}

Tensor family_labels(const Family& f) {
  if (!f.segmentation) return Tensor::from_vector({0, 3, 5, 9}, Shape{4}, DType::I64);
  std::vector<double> v(static_cast<size_t>(4 * f.hw * f.hw));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % static_cast<size_t>(f.classes));
  v[static_cast<size_t>((1 * f.hw + 2) * f.hw + 3)] = 255;  // labels[1, 2, 3]
  return Tensor::from_vector(v, Shape{4, f.hw, f.hw}, DType::I64);
}

Tensor family_loss(const Family& f, const Tensor& logits, const Tensor& labels) {
  return f.segmentation ? CrossEntropyLoss({.ignore_index = 255})(logits, labels) : CrossEntropyLoss()(logits, labels);
}

class FamilyInterop : public ::testing::TestWithParam<Family> {};

TEST_P(FamilyInterop, PyTorchInitialisedWeightsReproducePyTorch) {
  const Family& f = GetParam();
  const char* dir_env = std::getenv("RINGTRAIN_INTEROP_DIR");
  if (!dir_env) GTEST_SKIP() << "RINGTRAIN_INTEROP_DIR not set (run through ctest, which exports the weights)";
  const fs::path dir(dir_env);
  if (!fs::exists(dir / (f.arch + ".h5")))
    GTEST_SKIP() << "no PyTorch export in " << dir << " (scripts/torch_interop.py export-golden needs python3-torch)";
  std::shared_ptr<Module> model = family_model(f);
  model->load_state_dict(load_checkpoint(dir / (f.arch + ".h5")).model);
  const nlohmann::json expected = nlohmann::json::parse(std::ifstream(dir / (f.arch + "_expected.json")));
  const Tensor x = family_input(f.hw), labels = family_labels(f);
  std::map<std::string, Tensor> params;
  for (auto& [n, t] : model->named_parameters()) params[n] = t;
  for (const std::string mode : {"train", "eval"}) {
    model->zero_grad();
    model->train(mode == "train");
    const Tensor logits = (*model)(x);
    const nlohmann::json& e = expected.at(mode);
    const nlohmann::json& noise = e.at("noise");
    const double logits_tol = std::max(1e-4, 2 * noise.at("logits").get<double>());
    EXPECT_TRUE(close_to_scale(logits.to_vector(), e.at("logits").get<std::vector<double>>(), logits_tol))
        << f.arch << " " << mode << " (bound " << logits_tol << ")";
    const Tensor loss = family_loss(f, logits, labels);
    EXPECT_NEAR(loss.item(), e.at("loss").get<double>(),
                logits_tol * std::max(1.0, std::abs(e.at("loss").get<double>())))
        << f.arch << " " << mode;
    loss.backward();
    for (const auto& [name, grad] : e.at("grads").items()) {
      ASSERT_TRUE(params.count(name)) << f.arch << ": no parameter " << name;
      const double tol = std::max(1e-3, 2 * noise.at("grads").at(name).get<double>());
      EXPECT_TRUE(close_to_scale(params.at(name).grad().to_vector(), grad.get<std::vector<double>>(), tol))
          << f.arch << " " << mode << " " << name << " (bound " << tol << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyInterop,
                         ::testing::Values(Family{"mobilenet_v2", 64, 10, false},
                                           Family{"efficientnet_b0", 64, 10, false},
                                           Family{"convnext_tiny", 32, 10, false}, Family{"unet", 32, 4, true}),
                         [](const ::testing::TestParamInfo<Family>& info) { return info.param.arch; });

}  // namespace
}  // namespace ringtrain
