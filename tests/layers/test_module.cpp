// Tests for layers/module.h and the basic layers: dotted names, state dicts and their errors,
// train/eval, device moves keeping identity, Linear's init and gradients, a small MLP that learns.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "layers/basic.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::gradients_match;

// A two-level model: names like torchvision's (`head.0.weight`).
class Tiny : public Module {
 public:
  Tiny() {
    fc1 = register_module("fc1", std::make_shared<Linear>(4, 3));
    head = register_module("head", std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                                       std::make_shared<ReLU>(), std::make_shared<Linear>(3, 2, Bias::Without)}));
    steps = register_buffer("steps", Tensor::zeros(Shape{1}, DType::I64));
  }
  Tensor forward(const Tensor& x) override { return head->forward(fc1->forward(x)); }
  std::string type_name() const override { return "Tiny"; }
  std::shared_ptr<Linear> fc1;
  std::shared_ptr<Sequential> head;
  Tensor steps;
};

std::vector<std::string> names(const StateDict& sd) {
  std::vector<std::string> out;
  for (auto& [n, t] : sd) out.push_back(n);
  return out;
}

using testing::error_of;

TEST(Module, DottedNamesInStateDictOrder) {
  Tiny m;
  EXPECT_EQ(names(m.state_dict()), (std::vector<std::string>{"steps", "fc1.weight", "fc1.bias", "head.1.weight"}));
  auto params = m.named_parameters();
  ASSERT_EQ(params.size(), 3u);
  EXPECT_EQ(params[2].first, "head.1.weight");
  EXPECT_EQ(params[2].second.name(), "head.1.weight") << "tensors carry their full name for error messages";
  EXPECT_TRUE(params[0].second.requires_grad());
  EXPECT_FALSE(m.named_buffers()[0].second.requires_grad());
  EXPECT_EQ(m.num_parameters(), 4 * 3 + 3 + 3 * 2);
  EXPECT_NE(m.summary().find("head: Sequential"), std::string::npos) << m.summary();
}

TEST(Module, StateDictRoundTripKeepsTensorIdentity) {
  Tiny a, b;
  Tensor b_weight = b.fc1->weight();
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.fc1->weight().to_vector(), a.fc1->weight().to_vector());
  EXPECT_EQ(b.fc1->weight().impl(), b_weight.impl()) << "values are copied into the existing tensors";
  Tensor x = Tensor::uniform(Shape{5, 4}, -1, 1, 3);
  EXPECT_EQ(a(x).to_vector(), b(x).to_vector());
}

TEST(Module, StateDictErrorsNameTheEntry) {
  Tiny m;
  StateDict sd = m.state_dict();
  StateDict missing(sd.begin(), sd.end() - 1);
  std::string e = error_of([&] { m.load_state_dict(missing); });
  EXPECT_NE(e.find("'head.1.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  EXPECT_NO_THROW(m.load_state_dict(missing, StrictLoad::AllowMissingAndUnexpected));

  StateDict extra = sd;
  extra.emplace_back("fc2.weight", Tensor::zeros(Shape{1}));
  e = error_of([&] { m.load_state_dict(extra); });
  EXPECT_NE(e.find("unexpected entry 'fc2.weight'"), std::string::npos) << e;

  StateDict wrong_shape = sd;
  wrong_shape[1].second = Tensor::zeros(Shape{4, 3});
  const std::vector<double> before = m.fc1->weight().to_vector();
  e = error_of([&] { m.load_state_dict(wrong_shape); });
  EXPECT_NE(e.find("'fc1.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("[4, 3]"), std::string::npos) << e;
  EXPECT_NE(e.find("[3, 4]"), std::string::npos) << e;
  EXPECT_EQ(m.fc1->weight().to_vector(), before) << "a failed load changes nothing";

  StateDict wrong_dtype = sd;
  wrong_dtype[2].second = Tensor::zeros(Shape{3}, DType::F64);
  e = error_of([&] { m.load_state_dict(wrong_dtype); });
  EXPECT_NE(e.find("'fc1.bias'"), std::string::npos) << e;
  EXPECT_NE(e.find("f64"), std::string::npos) << e;

  StateDict twice = sd;
  twice.push_back(sd[0]);
  EXPECT_NE(error_of([&] { m.load_state_dict(twice); }).find("appears twice"), std::string::npos);
}

TEST(Module, TrainEvalPropagatesAndControlsDropout) {
  auto drop = std::make_shared<Dropout>(0.5);
  Sequential s{std::make_shared<Identity>(), drop};
  EXPECT_TRUE(drop->is_training());
  Tensor x = Tensor::ones(Shape{1000});
  EXPECT_NE(s(x).to_vector(), x.to_vector());
  s.eval();
  EXPECT_FALSE(drop->is_training());
  EXPECT_EQ(s(x).to_vector(), x.to_vector());
  s.train();
  EXPECT_TRUE(drop->is_training());
  EXPECT_THROW(Dropout(1.0), Error);
}

TEST(Module, RegistrationErrors) {
  class Bad : public Module {
   public:
    explicit Bad(int which) {
      if (which == 0) register_parameter("a.b", Tensor::zeros(Shape{1}));
      if (which == 1) {
        register_parameter("w", Tensor::zeros(Shape{1}));
        register_parameter("w", Tensor::zeros(Shape{1}));
      }
      if (which == 2) register_module("child", std::shared_ptr<Linear>());
    }
    Tensor forward(const Tensor& x) override { return x; }
    std::string type_name() const override { return "Bad"; }
  };
  EXPECT_NE(error_of([] { Bad b(0); }).find("'a.b'"), std::string::npos);
  EXPECT_NE(error_of([] { Bad b(1); }).find("registered twice"), std::string::npos);
  EXPECT_NE(error_of([] { Bad b(2); }).find("'child' is null"), std::string::npos);
}

TEST(Linear, InitShapesAndInputErrors) {
  manual_seed(1);
  Linear fc(100, 10);
  EXPECT_EQ(fc.weight().shape(), (Shape{10, 100}));
  for (double w : fc.weight().to_vector()) ASSERT_LE(std::abs(w), 0.1 + 1e-7);
  manual_seed(1);
  Linear again(100, 10);
  EXPECT_EQ(again.weight().to_vector(), fc.weight().to_vector()) << "init depends only on the seed";
  Linear other(100, 10);
  EXPECT_NE(other.weight().to_vector(), fc.weight().to_vector());
  std::string e = error_of([&] { fc(Tensor::zeros(Shape{2, 99})); });
  EXPECT_NE(e.find("Linear(100 -> 10)"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 99]"), std::string::npos) << e;
  EXPECT_EQ(Linear(3, 2, Bias::Without).named_parameters().size(), 1u);
  EXPECT_THROW(Linear(0, 2), Error);
}

TEST(Linear, GradientsMatchFiniteDifferencesAndReachTheModulesParameters) {
  Linear fc(4, 3, Bias::With, DType::F64);
  EXPECT_TRUE(
      gradients_match([&](const std::vector<Tensor>& in) { return fc(in[0]); }, {testing::random_f64(Shape{5, 4}, 1)}));
  // dL/dW for L = sum(fc(x)) is sum over rows of x, for every output row; dL/db = number of rows.
  fc.zero_grad();
  Tensor x = testing::random_f64(Shape{5, 4}, 2);
  sum(fc(x)).backward();
  std::vector<double> col_sums = sum(x, 0).to_vector(), gw = fc.weight().grad().to_vector();
  for (int o = 0; o < 3; ++o)
    for (int i = 0; i < 4; ++i)
      EXPECT_NEAR(gw[static_cast<size_t>(o * 4 + i)], col_sums[static_cast<size_t>(i)], 1e-12);
  EXPECT_EQ(fc.bias().grad().to_vector(), std::vector<double>(3, 5.0));
}

TEST(Module, SmallMlpLearnsAndFlattenWorks) {
  manual_seed(3);
  Sequential mlp{std::make_shared<Flatten>(), std::make_shared<Linear>(12, 16), std::make_shared<ReLU>(),
                 std::make_shared<Linear>(16, 3)};
  Tensor x = Tensor::normal(Shape{30, 2, 2, 3}, 0, 1, 5);
  std::vector<double> xv = x.to_vector(), yv(30);
  for (int i = 0; i < 30; ++i)
    yv[static_cast<size_t>(i)] =
        xv[static_cast<size_t>(i) * 12] > 0.5 ? 2 : (xv[static_cast<size_t>(i) * 12] < -0.5 ? 0 : 1);
  Tensor y = Tensor::from_vector(yv, Shape{30}, DType::I64);
  CrossEntropyLoss loss_fn(0.0);
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    Tensor loss = loss_fn(mlp(x), y);
    if (step == 0) first = loss.item();
    last = loss.item();
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor p : mlp.parameters()) {
      p.add_(p.grad(), -0.2);
    }
    mlp.zero_grad();
  }
  EXPECT_LT(last, first * 0.3) << first << " -> " << last;
  EXPECT_THROW(CrossEntropyLoss(-0.1), Error);
}

TEST(Module, ToCpuIsANoOpAndCudaWithoutDeviceIsAnError) {
  Tiny m;
  Tensor w = m.fc1->weight();
  m.to(Device::cpu());
  EXPECT_EQ(m.fc1->weight().impl(), w.impl());
  if (!cuda_available()) {
    EXPECT_THROW(m.to(Device::cuda(0)), Error);
    EXPECT_EQ(m.fc1->weight().device(), Device::cpu()) << "a failed move leaves the model where it was";
  } else {
    m.to(Device::cuda(0));
    EXPECT_EQ(m.fc1->weight().device(), Device::cuda(0));
    EXPECT_EQ(m.fc1->weight().impl(), w.impl()) << "the handle is the same tensor, now on the GPU";
  }
}

}  // namespace
}  // namespace ringtrain
