// Tests for layers/model_state.h: a ModelStateGuard puts back the buffers (BatchNorm running statistics),
// the generator's stream and the gradients (none stays none; values back into the same tensor), at the end
// of its scope and when an exception unwinds it; Grads::Accumulate keeps what a backward added; a
// caller's storage is reused.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <stdexcept>

#include "core/ops.h"
#include "layers/basic.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/model_state.h"
#include "test_util.h"

namespace ringtrain {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.nbytes())) == 0;
}

// conv, batch norm (running statistics), dropout (the generator), a linear head.
std::shared_ptr<Sequential> small_model() {
  Conv2dOptions o;
  o.padding = 1;
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<Conv2d>(3, 4, o));
  m->add(std::make_shared<BatchNorm2d>(4));
  m->add(std::make_shared<ReLU>());
  m->add(std::make_shared<Dropout>(0.3));
  m->add(std::make_shared<Flatten>());
  m->add(std::make_shared<Linear>(4 * 4 * 4, 3));
  return m;
}

// A training forward and backward: moves the statistics, draws dropout masks, adds gradients.
void train_once(Module& m) {
  const Tensor x = Tensor::normal(Shape{2, 4, 4, 3}, 0.0, 1.0, 11);
  const Tensor y = Tensor::from_vector({0, 2}, Shape{2}, DType::I64);
  CrossEntropyLoss()(m(x), y).backward();
}

struct Snapshot {
  std::vector<Tensor> buffers, grads;
  std::vector<TensorImpl*> grad_impls;
  uint64_t stream = 0;
  explicit Snapshot(const Module& m) : stream(rng_stream()) {
    for (const auto& [n, b] : m.named_buffers()) buffers.push_back(b.clone());
    for (const Tensor& p : m.parameters()) {
      grads.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
      grad_impls.push_back(p.grad().defined() ? p.grad().impl() : nullptr);
    }
  }
  void expect_same(const Module& m) const {
    EXPECT_EQ(rng_stream(), stream);
    size_t k = 0;
    for (const auto& [n, b] : m.named_buffers()) EXPECT_TRUE(same_bits(b, buffers[k++])) << n;
    k = 0;
    for (const Tensor& p : m.parameters()) {
      if (!grads[k].defined()) {
        EXPECT_FALSE(p.grad().defined()) << "parameter " << k << " had no gradient";
      } else {
        EXPECT_TRUE(same_bits(p.grad(), grads[k])) << "parameter " << k;
        EXPECT_EQ(p.grad().impl(), grad_impls[k]) << "parameter " << k << ": not the same gradient tensor";
      }
      ++k;
    }
  }
};

TEST(ModelStateGuard, PutsBackBuffersGeneratorAndNoGradients) {
  manual_seed(3);
  auto m = small_model();
  m->train();
  const Snapshot before(*m);
  {
    ModelStateGuard untouched(*m);
    train_once(*m);
    EXPECT_NE(rng_stream(), before.stream);  // the test moves what the guard must put back
    EXPECT_TRUE(m->parameters()[0].grad().defined());
  }
  before.expect_same(*m);
}

TEST(ModelStateGuard, PutsBackGradientValuesIntoTheSameTensors) {
  manual_seed(4);
  auto m = small_model();
  m->train();
  train_once(*m);  // gradients exist now: the guard must keep these tensors (a bucket's views) and values
  const Snapshot before(*m);
  {
    ModelStateGuard untouched(*m);
    train_once(*m);
    train_once(*m);
  }
  before.expect_same(*m);
}

TEST(ModelStateGuard, PutsBackWhenAnExceptionUnwindsIt) {
  manual_seed(5);
  auto m = small_model();
  m->train();
  const Snapshot before(*m);
  EXPECT_THROW(
      {
        ModelStateGuard untouched(*m);
        train_once(*m);
        throw std::runtime_error("the probe failed after its forward and backward");
      },
      std::runtime_error);
  before.expect_same(*m);
}

TEST(ModelStateGuard, AccumulateKeepsTheGradientsAndStorageIsReused) {
  manual_seed(6);
  auto m = small_model();
  m->train();
  const Snapshot before(*m);
  std::vector<Tensor> buffers;
  for (const auto& [n, b] : m->named_buffers()) buffers.push_back(b);
  std::vector<Tensor> storage;
  {
    ModelStateGuard untouched(buffers, &storage);
    train_once(*m);
  }
  ASSERT_EQ(storage.size(), buffers.size());
  const TensorImpl* first = storage[0].impl();
  EXPECT_EQ(rng_stream(), before.stream);
  size_t k = 0;
  for (const auto& [n, b] : m->named_buffers()) EXPECT_TRUE(same_bits(b, before.buffers[k++])) << n;
  EXPECT_TRUE(m->parameters()[0].grad().defined());  // a recompute's gradients are the run's
  {
    ModelStateGuard untouched(buffers, &storage);
    train_once(*m);
  }
  EXPECT_EQ(storage[0].impl(), first);  // made once, reused
}

}  // namespace
}  // namespace ringtrain
