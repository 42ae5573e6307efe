// Tests for layers/recompute.h: a recomputed block trains the plain block's bits (gradients, outputs,
// batch-norm running statistics, dropout masks, the generator's position afterwards), with accumulation
// and with an input that needs no gradient; it holds less between forward and backward, the inputs it
// keeps packed by their zeros; outside gradient mode it is the forward; --recompute's marking names a
// model that is no sequence of blocks.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "layers/basic.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/models/resnet.h"
#include "layers/recompute.h"
#include "test_util.h"

namespace ringtrain {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.nbytes())) == 0;
}

// conv, batch norm, ReLU, dropout: every kind of state a recompute must get right.
class ConvBlock : public Module {
 public:
  ConvBlock(int64_t in, int64_t out) {
    Conv2dOptions o;
    o.padding = 1;
    conv = register_module("conv", std::make_shared<Conv2d>(in, out, o));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(out));
    drop = register_module("drop", std::make_shared<Dropout>(0.3));
  }
  Tensor forward(const Tensor& x) override { return drop->forward(relu(bn->forward(conv->forward(x)))); }
  std::string type_name() const override { return "ConvBlock"; }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<Dropout> drop;
};

std::shared_ptr<Sequential> make_net() {
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<ConvBlock>(3, 4));
  net->add(std::make_shared<ConvBlock>(4, 4));
  net->add(std::make_shared<Flatten>());
  net->add(std::make_shared<Linear>(4 * 6 * 6, 3));
  return net;
}

struct Trained {
  std::vector<Tensor> outputs, grads;
  StateDict state;
  uint64_t stream_after = 0;
};

// Two micro-batches accumulated (forward, backward each), from the same generator position.
Trained run(Module& net, const Tensor& labels) {
  Trained t;
  set_rng_stream(1000);
  CrossEntropyLoss loss_fn(0.0);
  for (int micro = 0; micro < 2; ++micro) {
    const Tensor x = Tensor::normal(Shape{4, 6, 6, 3}, 0, 1, 7, DType::F32, Device::cpu(), micro);
    Tensor y = net(x);
    t.outputs.push_back(y.detach().clone());
    loss_fn(y, labels).backward();
  }
  for (const Tensor& p : net.parameters()) t.grads.push_back(p.grad());
  t.state = net.state_dict();
  t.stream_after = rng_stream();
  return t;
}

void expect_same(const Trained& a, const Trained& b) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  for (size_t i = 0; i < a.outputs.size(); ++i) EXPECT_TRUE(same_bits(a.outputs[i], b.outputs[i])) << "output " << i;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(same_bits(a.grads[i], b.grads[i])) << "gradient " << i;
  ASSERT_EQ(a.state.size(), b.state.size());
  for (size_t i = 0; i < a.state.size(); ++i)
    EXPECT_TRUE(same_bits(a.state[i].second, b.state[i].second)) << a.state[i].first;
  EXPECT_EQ(a.stream_after, b.stream_after);
}

TEST(Recompute, ABlockRecomputedTrainsThePlainBlocksBits) {
  manual_seed(3);
  auto plain = make_net();
  auto again = make_net();
  again->load_state_dict(plain->state_dict());
  EXPECT_EQ(recompute_blocks(*again), 3);
  const std::vector<Block> blocks = again->blocks();
  for (size_t i = 0; i < blocks.size(); ++i)
    EXPECT_EQ(blocks[i].modules.front()->recomputes(), i + 1 < blocks.size()) << "block " << i;
  const Tensor labels = Tensor::from_vector({0, 2, 1, 2}, Shape{4}, DType::I64);
  const Trained a = run(*plain, labels), b = run(*again, labels);
  expect_same(a, b);
  // The dropout drew (a mask per micro-batch and block), so the equal positions are not trivially equal.
  EXPECT_GT(a.stream_after, 1000u);
}

// Two ResNet-20s with the same weights, the second to be recomputed.
struct ResNetPair {
  ResNetPair() {
    ResNetOptions o;
    o.num_classes = 3;
    manual_seed(5);
    plain = std::make_unique<ResNet>("resnet20", o);
    again = std::make_unique<ResNet>("resnet20", o);
    again->load_state_dict(plain->state_dict());
  }
  std::unique_ptr<ResNet> plain, again;
};

TEST(Recompute, AResNetRecomputesItsResidualBlocksToTheSameBits) {
  ResNetPair nets;
  // The stem (three modules, its own switch) and 9 residual blocks; the head, last, stays plain.
  EXPECT_EQ(recompute_blocks(*nets.again), 10);
  EXPECT_FALSE(nets.again->blocks().back().modules.front()->recomputes());
  const Tensor labels = Tensor::from_vector({0, 2, 1, 2}, Shape{4}, DType::I64);
  expect_same(run(*nets.plain, labels), run(*nets.again, labels));
}

// The recompute takes the forward's batch statistics (core/ops.h BatchNormTape): a SyncBatchNorm block
// exchanges them once per step recomputed as plain, and trains the plain block's bits; a block whose
// recompute runs other batch norms than its forward is an error naming what differs.
class CountingExchange final : public BatchNormExchange {
 public:
  Tensor all_gather(const Tensor& local) override {
    ++gathers;
    return local.clone();
  }
  void all_reduce_sum(Tensor&) override { ++reduces; }
  int gathers = 0, reduces = 0;
};

TEST(Recompute, TheRecomputeTakesTheForwardsBatchStatistics) {
  manual_seed(3);
  auto plain = make_net();
  auto again = make_net();
  again->load_state_dict(plain->state_dict());
  recompute_blocks(*again);
  auto sync = [](Sequential& net) {
    auto exchange = std::make_shared<CountingExchange>();
    for (int b = 0; b < 2; ++b)
      std::dynamic_pointer_cast<ConvBlock>(net.blocks()[b].modules.front())->bn->set_cross_replica(exchange);
    return exchange;
  };
  const auto ep = sync(*plain), er = sync(*again);
  const Tensor labels = Tensor::from_vector({0, 2, 1, 2}, Shape{4}, DType::I64);
  expect_same(run(*plain, labels), run(*again, labels));
  EXPECT_EQ(ep->gathers, 4);  // 2 micro-batches x 2 batch norms
  EXPECT_EQ(er->gathers, ep->gathers) << "the recompute exchanged its statistics again";
  EXPECT_EQ(er->reduces, ep->reduces);

  // A block that runs another batch norm the second time: the recompute stops, naming both.
  class Fickle : public Module {
   public:
    Fickle() {
      a = register_module("a", std::make_shared<BatchNorm2d>(3));
      b = register_module("b", std::make_shared<BatchNorm2d>(5));
    }
    Tensor forward(const Tensor& x) override {
      if (++calls == 1) return a->forward(x);
      return skip_second ? mul(x, 2.0) : b->forward(Tensor::ones(Shape{2, 2, 2, 5}));
    }
    bool skip_second = false;
    std::string type_name() const override { return "Fickle"; }
    std::shared_ptr<BatchNorm2d> a, b;
    int calls = 0;
  } fickle;
  Tensor x = Tensor::normal(Shape{2, 2, 2, 3}, 0, 1, 5);
  x.set_requires_grad(true);
  Tensor y = recompute(fickle, x);
  const std::string e = testing::error_of([&] { sum(y).backward(); });
  EXPECT_NE(e.find("the recompute's batch norm 1 is not the forward's (batch_norm of 3 channels)"), std::string::npos)
      << e;
  fickle.calls = 0;
  fickle.skip_second = true;
  y = recompute(fickle, x);
  const std::string fewer = testing::error_of([&] { sum(y).backward(); });
  EXPECT_NE(fewer.find("the recompute ran 0 training-mode batch norms but the forward it repeats ran 1"),
            std::string::npos)
      << fewer;
}

// What is held between forward and backward: a block's input instead of its activations.
TEST(Recompute, HoldsLessBetweenForwardAndBackward) {
  ResNetPair nets;
  recompute_blocks(*nets.again);
  const Tensor x = Tensor::normal(Shape{8, 16, 16, 3}, 0, 1, 9);
  auto held = [&](Module& net) {
    const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
    Tensor y = net(x);
    const int64_t kept = memory_stats(Device::cpu()).allocated_bytes - before;
    sum(y).backward();
    return kept;
  };
  const int64_t p = held(*nets.plain), r = held(*nets.again);
  EXPECT_LT(r * 3, p) << "plain " << p << " bytes, recomputed " << r;
}

// The inputs kept are packed by their zeros (core/pack.h) once only their block holds them, and the
// recompute starts from the same bits: three Linear+ReLU blocks on 512x256 inputs, each about half zero.
TEST(Recompute, KeepsTheInputsOnlyItHoldsPackedByTheirZeros) {
  auto make = [] {
    auto net = std::make_shared<Sequential>();
    for (int b = 0; b < 3; ++b) {
      auto block = std::make_shared<Sequential>();
      block->add(std::make_shared<Linear>(256, 256));
      block->add(std::make_shared<ReLU>());
      net->add(block);
    }
    return net;
  };
  manual_seed(11);
  auto plain = make(), again = make();
  again->load_state_dict(plain->state_dict());
  // Every block marked by hand (recompute_blocks would leave the last plain).
  for (const Block& b : again->blocks()) b.modules.front()->set_recompute(true);
  Tensor x = Tensor::normal(Shape{512, 256}, 0, 1, 4);
  x.set_requires_grad(true);
  [[maybe_unused]] const int64_t dense = x.nbytes();  // (unused under AddressSanitizer)
  auto kept = [&](Module& net) {
    const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
    Tensor y = net(x);
    const int64_t held = memory_stats(Device::cpu()).allocated_bytes - before;
    sum(y).backward();
    return held;
  };
  const int64_t p = kept(*plain);
  Tensor gx = x.grad().clone();
  x.zero_grad();
  const int64_t r = kept(*again);
#if !defined(__SANITIZE_ADDRESS__)  // (AddressSanitizer's heap keeps a packed block at its size)
  // Held: block 1's input packed (about half), block 2's input dense (no block after it to pack it at),
  // the output; block 0's input is the caller's x, left alone.
  EXPECT_GT(r, dense * 23 / 10) << "recomputed " << r << " bytes, " << dense << " per input";
  EXPECT_LT(r, dense * 27 / 10) << "recomputed " << r << " bytes, " << dense << " per input";
#endif
  EXPECT_GT(p, r);
  EXPECT_TRUE(same_bits(x.grad(), gx));
  for (size_t i = 0; i < plain->parameters().size(); ++i)
    EXPECT_TRUE(same_bits(plain->parameters()[i].grad(), again->parameters()[i].grad())) << "parameter " << i;
}

TEST(Recompute, OutsideGradientModeItIsTheForwardAndTheInputIsLeftAlone) {
  manual_seed(3);
  auto net = make_net();
  net->eval();
  const Tensor x = Tensor::normal(Shape{2, 6, 6, 3}, 0, 1, 11);
  Tensor plain;
  {
    NoGradGuard no_grad;
    plain = net->forward(x);
    const Tensor y = recompute(*net, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(same_bits(plain, y));
  }
  // A block that returns its input: the recompute node goes on a new handle, never on x itself.
  Sequential identity;
  Tensor leaf = Tensor::normal(Shape{3}, 0, 1, 12);
  leaf.set_requires_grad(true);
  const Tensor y = recompute(identity, leaf);
  EXPECT_EQ(leaf.grad_fn(), nullptr);
  y.backward(Tensor::ones(Shape{3}));
  EXPECT_TRUE(same_bits(leaf.grad(), Tensor::ones(Shape{3})));
}

class NoBlocks : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "NoBlocks"; }
};

TEST(Recompute, RecomputeNamesAModelThatIsNoSequenceOfBlocks) {
  NoBlocks m;
  const std::string e = testing::error_of([&] { recompute_blocks(m); });
  EXPECT_NE(e.find("--recompute: the model (NoBlocks) is no sequence of blocks"), std::string::npos) << e;
}

}  // namespace
}  // namespace ringtrain
