// PyTorch interop: torchvision ResNet-18 and a CIFAR ResNet-20, initialised by PyTorch and exported by
// scripts/torch_interop.py (export-golden, run by CTest first), load into ringtrain's ResNets and
// reproduce PyTorch's logits, loss and gradients on a fixed input (f32). Skips, with the reason, when
// the export is not there (no python3-torch).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/ops.h"
#include "io/checkpoint.h"
#include "layers/loss.h"
#include "layers/models/resnet.h"
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

}  // namespace
}  // namespace ringtrain
