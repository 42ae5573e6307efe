// Golden checks against PyTorch dumps (tests/golden/*.json, written by scripts/make_goldens.py):
// forward values and gradients in f64 (tight) and f32 (loose).
#include <gtest/gtest.h>

#include "core/ops.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;
using testing::load_golden;

TEST(Golden, MatmulMatchesPyTorch) {
  auto g = load_golden("matmul");
  for (DType dtype : {DType::F64, DType::F32}) {
    const double tol = dtype == DType::F64 ? 1e-12 : 1e-5;
    Tensor a = g.at("a").to(dtype).detach().set_requires_grad(), b = g.at("b").to(dtype).detach().set_requires_grad();
    Tensor c = matmul(a, b);
    EXPECT_TRUE(all_close(c, g.at("c"), tol, tol)) << dtype_name(dtype);
    c.backward(g.at("upstream").to(dtype));
    EXPECT_TRUE(all_close(a.grad(), g.at("grad_a"), tol, tol)) << dtype_name(dtype);
    EXPECT_TRUE(all_close(b.grad(), g.at("grad_b"), tol, tol)) << dtype_name(dtype);

    Tensor ba = g.at("batched_a").to(dtype).detach().set_requires_grad(),
           bb = g.at("batched_b").to(dtype).detach().set_requires_grad();
    Tensor bc = matmul(ba, bb);
    EXPECT_TRUE(all_close(bc, g.at("batched_c"), tol, tol));
    sum(bc).backward();
    EXPECT_TRUE(all_close(ba.grad(), g.at("batched_grad_a"), tol, tol));
    EXPECT_TRUE(all_close(bb.grad(), g.at("batched_grad_b"), tol, tol));
  }
}

TEST(Golden, CrossEntropyWithLabelSmoothingMatchesPyTorch) {
  auto g = load_golden("cross_entropy");
  const double smoothing = g.meta.at("label_smoothing");
  Tensor labels = g.at("labels").to(DType::I64);
  for (DType dtype : {DType::F64, DType::F32}) {
    const double tol = dtype == DType::F64 ? 1e-12 : 1e-5;
    Tensor logits = g.at("logits").to(dtype).detach().set_requires_grad();
    Tensor loss = cross_entropy(logits, labels, smoothing);
    EXPECT_TRUE(all_close(loss.reshape(Shape{1}), g.at("loss").reshape(Shape{1}), tol, tol)) << dtype_name(dtype);
    loss.backward();
    EXPECT_TRUE(all_close(logits.grad(), g.at("grad_logits"), tol, tol)) << dtype_name(dtype);

    Tensor plain_logits = g.at("logits").to(dtype).detach().set_requires_grad();
    Tensor plain = cross_entropy(plain_logits, labels);
    EXPECT_TRUE(all_close(plain.reshape(Shape{1}), g.at("loss_no_smoothing").reshape(Shape{1}), tol, tol));
    plain.backward();
    EXPECT_TRUE(all_close(plain_logits.grad(), g.at("grad_logits_no_smoothing"), tol, tol));
  }
}

// The same expression as composed_golden() in scripts/make_goldens.py.
Tensor composed(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor h = relu(linear(x, w, b));
  Tensor z = add(mul(tanh(h), exp(mul(h, -0.5))), sigmoid(sub(h, mean(h, 1, true))));
  return sub(add(mul(sum(mul(softmax(z), z)), 0.25), sum(max(sqrt(add(mul(h, h), 1.0)), 0))), mean(log_softmax(z)));
}

TEST(Golden, ComposedExpressionMatchesPyTorch) {
  auto g = load_golden("composed");
  for (DType dtype : {DType::F64, DType::F32}) {
    const double tol = dtype == DType::F64 ? 1e-12 : 2e-5;
    Tensor x = g.at("x").to(dtype).detach().set_requires_grad();
    Tensor w = g.at("w").to(dtype).detach().set_requires_grad();
    Tensor b = g.at("b").to(dtype).detach().set_requires_grad();
    Tensor loss = composed(x, w, b);
    EXPECT_TRUE(all_close(loss.reshape(Shape{1}), g.at("loss").reshape(Shape{1}), tol, tol)) << dtype_name(dtype);
    loss.backward();
    EXPECT_TRUE(all_close(x.grad(), g.at("grad_x"), tol, tol)) << dtype_name(dtype);
    EXPECT_TRUE(all_close(w.grad(), g.at("grad_w"), tol, tol)) << dtype_name(dtype);
    EXPECT_TRUE(all_close(b.grad(), g.at("grad_b"), tol, tol)) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace ringtrain
