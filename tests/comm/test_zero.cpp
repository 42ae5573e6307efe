// Runs under mpirun with 1, 2, 3 and 4 ranks: ZeRO-1 (GradSync zero_stage 1 + ZeroOptimizer) trains
// bitwise like the unsharded GradSync with the same optimizer — SGD with Nesterov momentum and AdamW,
// weight decay, no_sync accumulation, gradient clipping, f16 loss scaling with overflowing steps skipped,
// parameters that do not divide by the world size (a 1-element bias, ones smaller than the world) — with
// the parameters' all-gather overlapped with the next forward (and without, for layers that do not say
// when they read their parameters), and its state is the canonical, unsharded one, loadable either way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "comm/grad_sync.h"
#include "comm/world.h"
#include "comm/zero.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "layers/basic.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/pooling.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace ringtrain::comm {
namespace {

constexpr int64_t kPerRank = 3, kHW = 5, kCh = 3, kClasses = 1;  // a 1-class head: a 1-element bias

// A custom layer with a parameter of its own that calls use_parameters() only in its first `announced`
// forwards (-1: always).
class Scale : public Module {
 public:
  explicit Scale(int announced) : announced_(announced) { w_ = register_parameter("w", Tensor::full(Shape{1}, 1.5)); }
  Tensor forward(const Tensor& x) override {
    if (announced_ < 0 || calls_++ < announced_) use_parameters();
    return mul(x, w_);
  }
  std::string type_name() const override { return "Scale"; }

 private:
  int announced_, calls_ = 0;
  Tensor w_;
};

// scale: no Scale layer (nullopt) or one announcing its use that many times.
std::shared_ptr<Sequential> make_model(std::optional<int> scale = std::nullopt) {
  manual_seed(11);
  Conv2dOptions c;
  c.padding = 1;
  c.bias = Bias::With;
  std::vector<std::shared_ptr<Module>> layers{std::make_shared<Conv2d>(kCh, 2, c), std::make_shared<ReLU>(),
                                              std::make_shared<Conv2d>(2, 7, c), std::make_shared<ReLU>(),
                                              std::make_shared<GlobalAvgPool>()};
  if (scale) layers.push_back(std::make_shared<Scale>(*scale));
  layers.push_back(std::make_shared<Linear>(7, kClasses));
  auto model = std::make_shared<Sequential>();
  for (auto& l : layers) model->add(l);
  return model;
}

Tensor batch(int step, int micro) {
  World& w = World::init();
  return Tensor::normal(Shape{kPerRank, kHW, kHW, kCh}, 0, 1,
                        1000 * step + 10 * micro + static_cast<uint64_t>(w.rank()));
}

enum class Kind { Sgd, AdamW };

std::unique_ptr<Optimizer> make_optimizer(Kind kind, std::vector<NamedParameter> params) {
  if (kind == Kind::Sgd)
    return std::make_unique<Sgd>(std::move(params),
                                 SgdOptions{.momentum = 0.9, .nesterov = true, .weight_decay = 5e-4});
  return std::make_unique<AdamW>(std::move(params), AdamWOptions{.weight_decay = 0.05});
}

struct Extras {
  double clip = 0;           // > 0: clip_grad_norm to this
  bool f16 = false;          // autocast f16 + a loss scaler that overflows now and then
  std::optional<int> scale;  // a Scale layer (see make_model)
  bool overlap_gather = true;
};

struct Trained {
  Extras extras;
  std::shared_ptr<Sequential> model;
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<Optimizer> opt;
  std::optional<GradScaler> scaler;
  std::vector<double> norms;  // clip_grad_norm's, per step taken
  int skipped = 0;
  Trained(Kind kind, bool zero, double bucket_mb, Extras e = {}) : extras(e), model(make_model(e.scale)) {
    // 2^40 overflows the f16 activations' gradients; backing off by 2^-30 makes them finite; growing
    // by 2^30 after 3 clean steps overflows again: steps 0, 4, 8, ... are skipped.
    if (e.f16)
      scaler.emplace(GradScalerOptions{.init_scale = std::ldexp(1.0, 40),
                                       .growth_factor = std::ldexp(1.0, 30),
                                       .backoff_factor = std::ldexp(1.0, -30),
                                       .growth_interval = 3});
    GradSyncOptions o;
    o.overlap_gather = e.overlap_gather;
    o.first_bucket_mb = bucket_mb;
    o.bucket_mb = bucket_mb;
    o.zero_stage = zero ? 1 : 0;
    sync = std::make_unique<GradSync>(*model, make_communicator(Backend::Ring, World::init().comm()), o);
    if (zero)
      opt = std::make_unique<ZeroOptimizer>(
          *sync, [kind](std::vector<NamedParameter> p) { return make_optimizer(kind, std::move(p)); });
    else
      opt = make_optimizer(kind, as_named(model->named_parameters()));
  }
  void steps(int from, int to, int accum) {
    for (int s = from; s < to; ++s) {
      sync->zero_grad();
      for (int m = 0; m < accum; ++m) {
        Tensor y;
        {
          AutocastGuard autocast(extras.f16 ? std::optional<DType>(DType::F16) : std::nullopt);
          y = mean(mul((*model)(batch(s, m)), 1.0 / accum));
        }
        if (scaler) y = scaler->scale_loss(y);
        if (m + 1 < accum) {
          auto guard = sync->no_sync();
          y.backward();
        } else {
          y.backward();
        }
      }
      sync->finish();
      // What the Trainer does: with ZeRO each rank holds its shard of the averaged gradients.
      auto* zero = dynamic_cast<ZeroOptimizer*>(opt.get());
      const std::vector<Tensor> held = zero ? zero->shard_parameters() : model->parameters();
      const bool take = !scaler || scaler->unscale(held, zero);
      if (take && extras.clip > 0) norms.push_back(clip_grad_norm(held, extras.clip, zero));
      if (take) opt->step(0.01 * (1 + s % 3));
      if (scaler) scaler->update(!take);
      skipped += take ? 0 : 1;
    }
  }
};

void expect_same_parameters(Trained& a, Trained& b, const std::string& what) {
  a.sync->wait_parameters();  // ZeRO: the last step's gather was left to the next forward
  b.sync->wait_parameters();
  const auto pa = a.model->named_parameters(), pb = b.model->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    ASSERT_EQ(std::memcmp(pa[i].second.data_ptr(), pb[i].second.data_ptr(), pa[i].second.nbytes()), 0)
        << what << ": parameter " << pa[i].first << " differs on rank " << World::init().rank();
}

class Zero : public ::testing::TestWithParam<Kind> {};

TEST_P(Zero, TrainsBitwiseLikeTheUnshardedOptimizer) {
  for (double bucket_mb : {1e-4, 25.0}) {  // a bucket per parameter (most uneven) and one for all
    Trained plain(GetParam(), false, bucket_mb), zero(GetParam(), true, bucket_mb);
    plain.steps(0, 20, 2);
    zero.steps(0, 20, 2);
    expect_same_parameters(plain, zero, "after 20 steps with accumulation 2");
    EXPECT_TRUE(zero.sync->gather_overlapped()) << "every layer says when it reads its parameters";
  }
}

TEST_P(Zero, ClipsAndSkipsOverflowingF16StepsBitwiseLikeTheUnshardedOptimizer) {
  // Clipping's norm and the loss scaler's finite check combine over the shards: the same decisions, bits.
  Extras e;
  e.clip = 0.05;
  e.f16 = true;
  Trained plain(GetParam(), false, 1e-4, e), zero(GetParam(), true, 1e-4, e);
  plain.steps(0, 20, 2);
  zero.steps(0, 20, 2);
  expect_same_parameters(plain, zero, "after 20 f16 steps with clipping");
  EXPECT_EQ(zero.skipped, plain.skipped);
  EXPECT_GE(plain.skipped, 4) << "steps 0, 4, 8, 12 and 16 overflow";
  ASSERT_EQ(zero.norms.size(), plain.norms.size());
  bool clipped = false;
  for (size_t i = 0; i < plain.norms.size(); ++i) {
    EXPECT_EQ(zero.norms[i], plain.norms[i]) << "the norm at taken step " << i;
    clipped = clipped || plain.norms[i] > e.clip;
  }
  EXPECT_TRUE(clipped) << "the test must clip";
}

TEST(Zero, ALayerThatDoesNotSayWhenItReadsItsParametersTurnsTheOverlapOff) {
  for (bool overlap : {true, false}) {
    Extras e;
    e.scale = -1;
    e.overlap_gather = overlap;
    Extras quiet = e;
    quiet.scale = 0;  // never calls use_parameters()
    Trained plain(Kind::Sgd, false, 1e-4, quiet), announced(Kind::Sgd, true, 1e-4, e),
        silent(Kind::Sgd, true, 1e-4, quiet);
    plain.steps(0, 6, 1);
    announced.steps(0, 6, 1);
    silent.steps(0, 6, 1);
    expect_same_parameters(plain, announced, "the custom layer announcing its reads");
    expect_same_parameters(plain, silent, "the custom layer not announcing them");
    EXPECT_EQ(announced.sync->gather_overlapped(), overlap);
    EXPECT_FALSE(silent.sync->gather_overlapped()) << "an unannounced read: every gather waited for";
  }
}

TEST(Zero, AReadWithoutTheHookAfterTheOverlapStartedIsAnErrorNamingTheParameter) {
  Extras e;
  e.scale = 1;  // announces its first forward only
  Trained zero(Kind::Sgd, true, 1e-4, e);
  zero.steps(0, 1, 1);
  EXPECT_TRUE(zero.sync->gather_overlapped());
  try {
    zero.steps(1, 2, 1);
    ADD_FAILURE() << "a stale read went unnoticed";
  } catch (const Error& err) {
    EXPECT_NE(
        std::string(err.what()).find("parameter '5.w' got a gradient but its layer did not call use_parameters()"),
        std::string::npos)
        << err.what();
  }
}

TEST_P(Zero, StateIsCanonicalAndLoadsEitherWay) {
  Trained plain(GetParam(), false, 1e-4), zero(GetParam(), true, 1e-4);
  plain.steps(0, 5, 1);
  zero.steps(0, 5, 1);
  const auto full = plain.opt->state();
  const auto gathered = zero.opt->state();  // collective; complete on rank 0
  if (World::init().rank() == 0) {
    ASSERT_EQ(gathered.size(), full.size());
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_EQ(gathered[i].first, full[i].first);
      ASSERT_TRUE(gathered[i].second.shape() == full[i].second.shape()) << full[i].first;
      EXPECT_EQ(std::memcmp(gathered[i].second.data_ptr(), full[i].second.data_ptr(), full[i].second.nbytes()), 0)
          << full[i].first;
    }
  }
  // The unsharded state into a sharded optimizer (and the other way round) continues bitwise.
  // The same bucket plan as `plain`: the ring sums each bucket in an order of its own, so only the same plan is
  // bitwise the same training on 3 or more ranks.
  Trained zero2(GetParam(), true, 1e-4), plain2(GetParam(), false, 1e-4);
  for (auto* r : {&zero2, &plain2}) {
    NoGradGuard no_grad;
    const auto src = plain.model->named_parameters(), dst = r->model->named_parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].second.detach().copy_(src[i].second);
  }
  zero2.opt->load_state(full);
  // gathered is complete on rank 0 only: every rank loads rank 0's copy.
  plain2.opt->load_state(full);
  plain.steps(5, 9, 1);
  zero2.steps(5, 9, 1);
  plain2.steps(5, 9, 1);
  expect_same_parameters(plain, zero2, "unsharded state loaded into ZeRO");
  expect_same_parameters(plain, plain2, "unsharded state reloaded");
}

TEST(Zero, StateFallsAsOneOverTheWorld) {
  Trained plain(Kind::AdamW, false, 25.0), zero(Kind::AdamW, true, 25.0);
  plain.steps(0, 1, 1);
  zero.steps(0, 1, 1);
  int64_t full = 0;
  for (const auto& [name, t] : plain.opt->state()) full += t.nbytes();
  const int64_t mine = dynamic_cast<ZeroOptimizer&>(*zero.opt).state_bytes();
  const int n = World::init().size();
  // 2 moments per element, split N ways (up to a rounding element), plus a few scalar step counts.
  EXPECT_LE(mine, full / n + 64 * 8 + 2 * 4 * 8) << "rank " << World::init().rank();
  EXPECT_NO_THROW(zero.opt->state());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Zero, ::testing::Values(Kind::Sgd, Kind::AdamW), [](const auto& info) {
  return info.param == Kind::Sgd ? std::string("SgdNesterov") : std::string("AdamW");
});

}  // namespace
}  // namespace ringtrain::comm
