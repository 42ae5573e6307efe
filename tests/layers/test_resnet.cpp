// ResNets: whole-model golden checks against PyTorch (ResNet-20 as in He et al. 2016 with ringtrain's
// names, torchvision ResNet-18) with weights from a formula both sides evaluate; parameter names and
// counts against torchvision; init; an overfitting run; architecture errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "layers/deterministic_state.h"
#include "layers/loss.h"
#include "layers/models/resnet.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;
using testing::load_golden;

using testing::deterministic_state;

void check_against_golden(const std::string& arch, int64_t hw, int64_t classes) {
  auto g = load_golden("resnet");
  ResNet model(arch, {.in_channels = 3, .num_classes = classes, .dtype = DType::F64});
  deterministic_state(model);
  std::vector<double> xs(static_cast<size_t>(2 * hw * hw * 3));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.05 * static_cast<double>(i));
  Tensor x = Tensor::from_vector(xs, Shape{2, hw, hw, 3}, DType::F64);
  Tensor labels = Tensor::from_vector({1, static_cast<double>(classes - 1)}, Shape{2}, DType::I64);
  model.train();
  Tensor logits = model(x);
  EXPECT_TRUE(all_close(logits, g.at(arch + "_logits"), 1e-10, 1e-10)) << arch;
  Tensor loss = CrossEntropyLoss(0.1)(logits, labels);
  EXPECT_NEAR(loss.item(), g.at(arch + "_loss").item(), 1e-10);
  loss.backward();
  std::map<std::string, Tensor> params;
  for (auto& [n, t] : model.named_parameters()) params[n] = t;
  for (const char* name :
       {"conv1.weight", "layer1.0.bn1.weight", "layer2.0.downsample.0.weight", "fc.weight", "fc.bias"})
    EXPECT_TRUE(all_close(params.at(name).grad(), g.at(arch + "_grad_" + name), 1e-9, 1e-10)) << arch << " " << name;
  std::map<std::string, Tensor> buffers;
  for (auto& [n, t] : model.named_buffers()) buffers[n] = t;
  EXPECT_TRUE(all_close(buffers.at("bn1.running_mean"), g.at(arch + "_running_mean_bn1"), 1e-12, 1e-12));
  EXPECT_EQ(buffers.at("bn1.num_batches_tracked").item(), 1.0);
  model.eval();
  NoGradGuard no_grad;
  EXPECT_TRUE(all_close(model(x), g.at(arch + "_eval_logits"), 1e-10, 1e-10)) << arch << " eval";
}

TEST(ResNet, ResNet20MatchesPyTorch) { check_against_golden("resnet20", 16, 10); }
TEST(ResNet, ResNet18MatchesTorchvision) { check_against_golden("resnet18", 64, 7); }

TEST(ResNet, ParameterNamesAndCountsMatchTorchvision) {
  // Counts from torchvision.models.resnetXX(num_classes=1000).
  const std::map<std::string, int64_t> counts{
      {"resnet18", 11689512}, {"resnet34", 21797672}, {"resnet50", 25557032}, {"resnet101", 44549160}};
  for (const auto& [arch, count] : counts) {
    ResNet m(arch, {});
    EXPECT_EQ(m.num_parameters(), count) << arch;
  }
  ResNet r50("resnet50", {});
  auto sd = r50.state_dict();
  EXPECT_EQ(sd.size(), 320u) << "torchvision resnet50 state_dict has 320 entries";
  EXPECT_EQ(sd[0].first, "conv1.weight");
  EXPECT_EQ(sd[0].second.shape(), (Shape{64, 7, 7, 3})) << "KRSC";
  std::set<std::string> names;
  for (auto& [n, t] : sd) names.insert(n);
  for (const char* n : {"layer1.0.downsample.0.weight", "layer4.2.bn3.running_var", "layer3.5.conv2.weight",
                        "bn1.num_batches_tracked", "fc.bias"})
    EXPECT_TRUE(names.count(n)) << n;
  // CIFAR ResNets: 6n+2 layers; ResNet-20 has 0.27M parameters (He et al. 2016, with projection shortcuts).
  ResNet r20("resnet20", {.num_classes = 10});
  EXPECT_EQ(r20.num_parameters(), 272474);
  EXPECT_EQ(ResNet("resnet110", {.num_classes = 10}).named_children().size(), 6u);  // conv1 bn1 layer1-3 fc
}

TEST(ResNet, InitFollowsTorchvisionAndZeroInitResidual) {
  manual_seed(11);
  ResNet m("resnet18", {.zero_init_residual = true});
  std::map<std::string, Tensor> p;
  for (auto& [n, t] : m.named_parameters()) p[n] = t;
  // He normal, fan_out = 64 * 3 * 3 for layer1 convolutions.
  std::vector<double> w = p.at("layer1.0.conv1.weight").to_vector();
  double sq = 0;
  for (double v : w) sq += v * v;
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(w.size())), std::sqrt(2.0 / (64 * 9)), 0.003);
  EXPECT_EQ(p.at("layer1.0.bn2.weight").to_vector(), std::vector<double>(64, 0.0)) << "zero_init_residual";
  EXPECT_EQ(p.at("layer1.0.bn1.weight").to_vector(), std::vector<double>(64, 1.0));
  EXPECT_EQ(p.at("bn1.bias").to_vector(), std::vector<double>(64, 0.0));
}

TEST(ResNet, CustomChannelsAndClassesAndBadArch) {
  ResNet m("resnet20", {.in_channels = 1, .num_classes = 10});
  Tensor y = m(Tensor::normal(Shape{2, 28, 28, 1}, 0, 1, 1));
  EXPECT_EQ(y.shape(), (Shape{2, 10}));
  try {
    ResNet bad("resnet19", {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'resnet19'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("resnet152"), std::string::npos);
  }
  EXPECT_THROW(m(Tensor::zeros(Shape{2, 28, 28, 3})), Error);
}

TEST(ResNet, ResNet20OverfitsAFixedBatch) {
  manual_seed(5);
  ResNet m("resnet20", {.num_classes = 10});
  Tensor x = Tensor::normal(Shape{32, 8, 8, 3}, 0, 1, 21);
  std::vector<double> ys(32);
  for (int i = 0; i < 32; ++i) ys[static_cast<size_t>(i)] = i % 10;
  Tensor y = Tensor::from_vector(ys, Shape{32}, DType::I64);
  Sgd opt(as_named(m.named_parameters()), SgdOptions{.momentum = 0.9, .weight_decay = 0.0});
  CrossEntropyLoss loss_fn;
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    Tensor loss = loss_fn(m(x), y);
    loss.backward();
    opt.step(0.05);
    if (step == 0) first = loss.item();
    last = loss.item();
  }
  EXPECT_LT(last, 0.1) << "from " << first;
}

}  // namespace
}  // namespace ringtrain
