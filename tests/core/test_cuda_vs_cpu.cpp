// CUDA kernels agree with CPU kernels, op by op and dtype by dtype (tolerance per op and dtype).
// Every test skips with the reason when there is no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/device.h"
#include "core/ops.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::all_close;

const Device kGpu = Device::cuda(0);

// Forward tolerance per activation dtype (tests/test_util.h).
double tol_for(DType t) { return testing::cuda_vs_cpu_tolerance(t); }

struct CudaCase {
  std::string name;
  std::function<Tensor(const std::vector<Tensor>&)> f;
  std::vector<Shape> shapes;
  bool positive = false;
  double tol_scale = 1.0;
};

std::vector<CudaCase> cases() {
  using In = std::vector<Tensor>;
  return {
      {"add_bcast", [](const In& x) { return add(x[0], x[1]); }, {Shape{64, 33}, Shape{33}}},
      {"sub_bcast", [](const In& x) { return sub(x[0], x[1]); }, {Shape{4, 1, 7}, Shape{5, 1}}},
      {"mul", [](const In& x) { return mul(x[0], x[1]); }, {Shape{1000}, Shape{1000}}},
      {"div", [](const In& x) { return div(x[0], x[1]); }, {Shape{300}, Shape{300}}, true},
      {"maximum", [](const In& x) { return maximum(x[0], x[1]); }, {Shape{257}, Shape{257}}},
      {"compare_lt", [](const In& x) { return lt(x[0], x[1]); }, {Shape{257}, Shape{257}}},
      {"scalar", [](const In& x) { return rsub(mul(add(x[0], 0.5), 3.0), 1.0); }, {Shape{513}}},
      {"pow", [](const In& x) { return pow(x[0], 1.5); }, {Shape{100}}, true},
      {"relu", [](const In& x) { return relu(x[0]); }, {Shape{4097}}},
      {"exp", [](const In& x) { return exp(x[0]); }, {Shape{999}}},
      {"log", [](const In& x) { return log(x[0]); }, {Shape{999}}, true},
      {"sqrt", [](const In& x) { return sqrt(x[0]); }, {Shape{999}}, true},
      {"tanh_sigmoid", [](const In& x) { return add(tanh(x[0]), sigmoid(x[0])); }, {Shape{999}}},
      {"sum_all", [](const In& x) { return sum(x[0]); }, {Shape{100000}}, false, 10},
      {"sum_dim0", [](const In& x) { return sum(x[0], 0); }, {Shape{37, 129}}, false, 10},
      {"sum_lastdim", [](const In& x) { return sum(x[0], -1); }, {Shape{37, 129}}, false, 10},
      {"max_dim", [](const In& x) { return max(x[0], 1); }, {Shape{17, 300, 3}}},
      {"argmax", [](const In& x) { return argmax(x[0], 1); }, {Shape{17, 300}}},
      {"matmul", [](const In& x) { return matmul(x[0], x[1]); }, {Shape{65, 130}, Shape{130, 33}}, false, 10},
      {"matmul_batched", [](const In& x) { return matmul(x[0], x[1]); }, {Shape{3, 16, 8}, Shape{3, 8, 5}}, false, 10},
      {"linear",
       [](const In& x) { return linear(x[0], x[1], x[2]); },
       {Shape{32, 64}, Shape{10, 64}, Shape{10}},
       false,
       10},
      {"softmax", [](const In& x) { return softmax(x[0]); }, {Shape{33, 1000}}},
      {"log_softmax", [](const In& x) { return log_softmax(x[0]); }, {Shape{33, 1000}}},
      {"dropout", [](const In& x) { return dropout(x[0], 0.3, true, 5, 7); }, {Shape{3000}}},
      // ---- the pieces of today's CNNs (core/cuda/shape.cu, activation.cu, group_norm.cu, resample.cu, and the
      // convolution and cross-entropy kernels in their new roles)
      {"cat",
       [](const In& x) {
         return cat({x[0], x[1]}, -1);
       },
       {Shape{4, 5, 3, 6}, Shape{4, 5, 3, 2}}},
      {"permute_narrow",
       [](const In& x) {
         return narrow(permute(x[0], {0, 3, 1, 2}), 2, 1, 3);
       },
       {Shape{3, 5, 4, 7}}},
      {"expand_where",
       [](const In& x) {
         return where(gt(x[0], x[1]), expand(x[0], Shape{3, 4, 5}), x[1]);
       },
       {Shape{4, 1}, Shape{3, 4, 5}}},
      {"clamp_relu6_leaky",
       [](const In& x) { return add(add(clamp(x[0], -0.5, 1.0), relu6(mul(x[0], 4.0))), leaky_relu(x[0], 0.1)); },
       {Shape{1031}}},
      {"gelu", [](const In& x) { return gelu(mul(x[0], 3.0)); }, {Shape{1031}}},
      {"gelu_tanh", [](const In& x) { return gelu(mul(x[0], 3.0), GeluApproximation::Tanh); }, {Shape{1031}}},
      {"silu_hardswish_hardsigmoid",
       [](const In& x) { return add(add(silu(mul(x[0], 3.0)), hardswish(mul(x[0], 3.0))), hardsigmoid(x[0])); },
       {Shape{1031}}},
      {"layer_norm",
       [](const In& x) {
         const DType p = x[0].dtype() == DType::F64 ? DType::F64 : DType::F32;
         return layer_norm(x[0], x[1].to(p), x[2].to(p), 1e-6);
       },
       {Shape{5, 7, 3, 96}, Shape{96}, Shape{96}},
       false,
       10},
      {"group_norm",
       [](const In& x) {
         const DType p = x[0].dtype() == DType::F64 ? DType::F64 : DType::F32;
         return group_norm(x[0], 8, x[1].to(p), x[2].to(p));
       },
       {Shape{3, 9, 11, 32}, Shape{32}, Shape{32}},
       false,
       10},
      {"adaptive_avg_pool", [](const In& x) { return adaptive_avg_pool2d(x[0], 3, 5); }, {Shape{2, 7, 9, 19}}},
      {"upsample_nearest", [](const In& x) { return upsample(x[0], {.out_h = 9, .out_w = 14}); }, {Shape{2, 4, 5, 19}}},
      {"upsample_bilinear",
       [](const In& x) { return upsample(x[0], {.scale_h = 2, .scale_w = 2, .mode = UpsampleMode::Bilinear}); },
       {Shape{2, 4, 5, 19}}},
      {"upsample_bilinear_corners",
       [](const In& x) {
         return upsample(x[0], {.out_h = 7, .out_w = 3, .mode = UpsampleMode::Bilinear, .align_corners = true});
       },
       {Shape{2, 4, 5, 19}}},
      {"conv_transpose2d",
       [](const In& x) {
         return conv_transpose2d(
             x[0], x[1], x[2],
             {.stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1, .output_pad_h = 1, .output_pad_w = 1});
       },
       {Shape{2, 5, 6, 16}, Shape{16, 3, 3, 8}, Shape{8}},
       false,
       10},
      {"depthwise_conv7x7",
       [](const In& x) { return conv2d(x[0], x[1], x[2], {.pad_h = 3, .pad_w = 3, .groups = 24}); },
       {Shape{2, 9, 9, 24}, Shape{24, 7, 7, 1}, Shape{24}},
       false,
       10},
      {"drop_path", [](const In& x) { return drop_path(x[0], 0.3, true, 5, 7, 13); }, {Shape{40, 3, 2, 5}}},
      {"cross_entropy_pixels",
       [](const In& x) {
         std::vector<double> labels(2 * 3 * 4);
         for (size_t i = 0; i < labels.size(); ++i) labels[i] = i % 7 == 3 ? 255 : static_cast<double>(i % 5);
         const DType p = x[0].dtype() == DType::F64 ? DType::F64 : DType::F32;
         return cross_entropy(x[0], Tensor::from_vector(labels, Shape{2, 3, 4}, DType::I64, x[0].device()),
                              {.label_smoothing = 0.1, .ignore_index = 255, .weight = x[1].to(p).detach()});
       },
       {Shape{2, 3, 4, 5}, Shape{5}},
       true},
  };
}

void PrintTo(const CudaCase& c, std::ostream* os) { *os << c.name; }

class CudaVsCpu : public ::testing::TestWithParam<std::tuple<CudaCase, DType>> {
 protected:
  // TF32 GEMMs carry ~1e-3 relative error; agreement is checked at full f32 precision.
  void SetUp() override { set_allow_tf32(false); }
  void TearDown() override { set_allow_tf32(true); }
};

TEST_P(CudaVsCpu, ForwardAgrees) {
  RT_REQUIRE_CUDA();
  const auto& [c, dtype] = GetParam();
  std::vector<Tensor> cpu_in, gpu_in;
  uint64_t seed = 100;
  for (const Shape& s : c.shapes) {
    Tensor t = Tensor::uniform(s, c.positive ? 0.5 : -2.0, 2.0, seed++, DType::F64).to(dtype);
    cpu_in.push_back(t);
    gpu_in.push_back(t.to(kGpu));
  }
  Tensor expected = c.f(cpu_in);
  Tensor actual = c.f(gpu_in);
  ASSERT_EQ(actual.device(), kGpu);
  const double tol = tol_for(dtype) * c.tol_scale;
  EXPECT_TRUE(all_close(actual.to(Device::cpu()), expected, tol, tol)) << c.name << " " << dtype_name(dtype);
}

TEST_P(CudaVsCpu, BackwardAgrees) {
  RT_REQUIRE_CUDA();
  const auto& [c, dtype] = GetParam();
  if (c.name == "compare_lt" || c.name == "argmax") GTEST_SKIP() << c.name << " has no gradient";
  std::vector<Tensor> cpu_in, gpu_in;
  uint64_t seed = 200;
  for (const Shape& s : c.shapes) {
    Tensor t = Tensor::uniform(s, c.positive ? 0.5 : -2.0, 2.0, seed++, DType::F64).to(dtype);
    cpu_in.push_back(t.clone().set_requires_grad());
    gpu_in.push_back(t.to(kGpu).set_requires_grad());
  }
  sum(c.f(cpu_in)).backward();
  sum(c.f(gpu_in)).backward();
  const double tol = tol_for(dtype) * c.tol_scale * 10;
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    ASSERT_EQ(gpu_in[i].grad().defined(), cpu_in[i].grad().defined()) << c.name << " input " << i;
    if (!cpu_in[i].grad().defined()) continue;  // an input the op does not differentiate (class weights)
    EXPECT_TRUE(all_close(gpu_in[i].grad().to(Device::cpu()), cpu_in[i].grad(), tol, tol))
        << c.name << " input " << i << " " << dtype_name(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaVsCpu,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(DType::F32, DType::F64, DType::F16, DType::BF16)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::string(dtype_name(std::get<1>(info.param)));
                         });

TEST(CudaVsCpuMisc, RandomAndConversionsAreBitwiseIdentical) {
  RT_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    EXPECT_EQ(Tensor::uniform(Shape{1001}, -1, 1, 3, t, kGpu).to_vector(),
              Tensor::uniform(Shape{1001}, -1, 1, 3, t).to_vector())
        << dtype_name(t);
    EXPECT_TRUE(all_close(Tensor::normal(Shape{1001}, 0, 1, 4, t, kGpu).to(Device::cpu()),
                          Tensor::normal(Shape{1001}, 0, 1, 4, t), tol_for(t), tol_for(t)))
        << dtype_name(t);
  }
  Tensor x = Tensor::uniform(Shape{777}, -300, 300, 5, DType::F64);
  for (int a = 0; a < kNumDTypes; ++a) {
    for (int b = 0; b < kNumDTypes; ++b) {
      DType from = static_cast<DType>(a), to = static_cast<DType>(b);
      Tensor src = (from == DType::U8 ? abs(x) : x).to(from);
      EXPECT_EQ(src.to(kGpu).to(to).to_vector(), src.to(to).to_vector())
          << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
}

// The element-wise kernels' vector paths (16-byte loads of 8 / 4 / 2 elements, the n % V tail one per
// thread) give the CPU's bits: sizes around a vector and a million, tensors 16-byte aligned (vector path)
// and one element into their buffer (scalar path), in place and not.
TEST(CudaVsCpuMisc, ElementwiseVectorPathsGiveTheCpusBits) {
  RT_REQUIRE_CUDA();
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{4099}, int64_t{(1 << 20) + 3}})
      for (bool aligned : {true, false}) {
        // Tensors one element longer; the unaligned ones start at element 1 (a copy to the GPU would align).
        auto make = [&](uint64_t seed, Device device) {
          const Tensor whole = Tensor::uniform(Shape{n + 1}, -4, 4, seed, DType::F64).to(dtype).to(device);
          return aligned ? whole.slice(0, n) : whole.slice(1, n + 1);
        };
        const Tensor a = make(61, Device::cpu()), b = make(62, Device::cpu());
        const Tensor ga_off = make(61, kGpu), gb = make(62, kGpu);
        const std::string what =
            std::string(dtype_name(dtype)) + " n=" + std::to_string(n) + (aligned ? "" : " unaligned");
        auto same = [&](const Tensor& gpu, const Tensor& cpu, const char* op) {
          EXPECT_EQ(gpu.to_vector(), cpu.to_vector()) << what << ": " << op;
        };
        same(add(ga_off, gb), add(a, b), "add");
        same(sub(ga_off, gb), sub(a, b), "sub");
        same(mul(ga_off, gb), mul(a, b), "mul");
        same(relu(ga_off), relu(a), "relu");
        same(neg(ga_off), neg(a), "neg");
        same(mul(ga_off, 0.37), mul(a, 0.37), "mul scalar");
        same(add(ga_off, 1.5), add(a, 1.5), "add scalar");
        Tensor in_place = ga_off.clone();
        Tensor expected = a.clone();
        in_place.add_(gb);
        expected.add_(b);
        same(in_place, expected, "add_ in place");
        in_place.mul_(-2.0);
        expected.mul_(-2.0);
        same(in_place, expected, "mul_ in place");
      }
}

// ---------------------------------------------------------------------------------------------------
// CUDA graphs (core/device.h)

// Without a CUDA device nothing is captured: the reason names it, and replay refuses. Runs everywhere.
TEST(CudaGraphTest, RefusesTheCpuSayingWhy) {
  CudaGraph graph;
  bool ran = false;
  const std::string why = graph.capture(Device::cpu(), [&] { ran = true; });
  EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
  EXPECT_FALSE(ran) << "nothing to capture on the CPU: the work is not run";
  EXPECT_FALSE(graph.ready());
  EXPECT_THROW(graph.replay(), Error);
}

// A training step (matmul, batch norm + ReLU, matmul, cross-entropy, backward, SGD with momentum)
// captured after two steps and replayed three times trains exactly as five steps run op by op: the
// parameters, momentum and running statistics the replays update in place, and their gradients.
TEST(CudaGraphTest, ReplayedStepsTrainLikeStepsRunOpByOp) {
  RT_REQUIRE_CUDA();
  struct Net {
    Tensor w1, gamma, beta, w2, rm, rv;
    std::unique_ptr<Sgd> opt;
  };
  const Tensor x = Tensor::normal(Shape{64, 32}, 0, 1, 71, DType::F32, kGpu);
  std::vector<double> ys(64);
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<double>(i % 10);
  const Tensor labels = Tensor::from_vector(ys, Shape{64}, DType::I64, kGpu);
  auto make = [&] {
    Net n;
    n.w1 = Tensor::normal(Shape{32, 48}, 0, 0.2, 72, DType::F32, kGpu).set_requires_grad();
    n.gamma = Tensor::ones(Shape{48}, DType::F32, kGpu).set_requires_grad();
    n.beta = Tensor::zeros(Shape{48}, DType::F32, kGpu).set_requires_grad();
    n.w2 = Tensor::normal(Shape{48, 10}, 0, 0.2, 73, DType::F32, kGpu).set_requires_grad();
    n.rm = Tensor::zeros(Shape{48}, DType::F32, kGpu);
    n.rv = Tensor::ones(Shape{48}, DType::F32, kGpu);
    n.opt = std::make_unique<Sgd>(
        std::vector<NamedParameter>{{"w1", n.w1}, {"gamma", n.gamma}, {"beta", n.beta}, {"w2", n.w2}},
        SgdOptions{.momentum = 0.9, .weight_decay = 5e-4});
    return n;
  };
  auto step = [&](Net& n) {
    n.opt->zero_grad();
    Tensor h = batch_norm(matmul(x, n.w1), n.gamma, n.beta, n.rm, n.rv, true, 0.1, 1e-5, /*fuse_relu=*/true);
    Tensor loss = cross_entropy(matmul(h, n.w2), labels);
    loss.backward();
    n.opt->step(0.05);
  };
  auto state = [](const Net& n) {
    std::vector<std::vector<double>> out;
    for (const Tensor& t : {n.w1, n.gamma, n.beta, n.w2}) {
      out.push_back(t.to_vector());
      out.push_back(t.grad().to_vector());
    }
    out.push_back(n.rm.to_vector());
    out.push_back(n.rv.to_vector());
    return out;
  };
  Net eager = make();
  for (int i = 0; i < 5; ++i) step(eager);
  Net graphed = make();
  step(graphed);
  step(graphed);
  CudaGraph graph;
  const std::string why = graph.capture(kGpu, [&] { step(graphed); });
  ASSERT_EQ(why, "") << "the step was not captured";
  ASSERT_TRUE(graph.ready());
  EXPECT_EQ(graph.memory_nodes(), 0) << "memory allocated inside the graph (cuBLAS's default workspace?)";
  for (int i = 0; i < 3; ++i) graph.replay();
  synchronize(kGpu);
  const auto want = state(eager), got = state(graphed);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "state tensor " << i;
}

// A thread whose first GEMM is inside a capture: its cuBLAS handle and workspace are made there (relaxed mode,
// as the caching allocator's own cudaMalloc), nothing is allocated inside the graph, and each replay gives the
// op-by-op product. Under RINGTRAIN_CUDA_SYNC=1 (gpu_check runs these tests so too) the capture's ops do not
// synchronize and the replay does.
TEST(CudaGraphTest, AThreadsFirstGemmCanBeCaptured) {
  RT_REQUIRE_CUDA();
  const Tensor a = Tensor::normal(Shape{96, 64}, 0, 1, 81, DType::F32, kGpu),
               b = Tensor::normal(Shape{64, 80}, 0, 1, 82, DType::F32, kGpu);
  const std::vector<double> want = matmul(a, b).to_vector();
  std::string why, error;
  int64_t memory_nodes = -1;
  std::vector<double> got;
  std::thread([&] {
    try {
      Tensor out = Tensor::empty(Shape{96, 80}, DType::F32, kGpu);
      CudaGraph graph;
      why = graph.capture(kGpu, [&] { out.copy_(matmul(a, b)); });
      if (!why.empty()) return;
      memory_nodes = graph.memory_nodes();
      out.zero_();
      graph.replay();
      got = out.to_vector();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  ASSERT_EQ(error, "");
  ASSERT_EQ(why, "") << (detail::cuda_sync_every_op() ? "under RINGTRAIN_CUDA_SYNC=1" : "");
  EXPECT_EQ(memory_nodes, 0);
  EXPECT_EQ(got, want);
}

// The label check of a captured cross-entropy belongs to the graph: each replay is checked with the flag
// and labels it left, even when a later replay (with good labels) overwrote them before the host read.
TEST(CudaGraphTest, EachReplayIsCheckedWithWhatItLeft) {
  RT_REQUIRE_CUDA();
  run_deferred_checks();
  const Tensor logits = Tensor::zeros(Shape{4, 3}, DType::F32, kGpu);
  Tensor labels = Tensor::from_vector({0, 1, 2, 0}, Shape{4}, DType::I64, kGpu);
  const Tensor good = Tensor::from_vector({0, 1, 2, 0}, Shape{4}, DType::I64, kGpu),
               bad = Tensor::from_vector({0, 7, 2, 0}, Shape{4}, DType::I64, kGpu);
  CudaGraph graph;
  ASSERT_EQ(graph.capture(kGpu, [&] { (void)cross_entropy(logits, labels); }), "");
  EXPECT_EQ(deferred_checks_pending(), 0u) << "the capture's check is the graph's, not the next read's";
  labels.copy_(bad);
  graph.replay();
  labels.copy_(good);
  graph.replay();
  EXPECT_EQ(deferred_checks_pending(), 2u) << "one check a replay";
  const std::string e = testing::error_of([] { run_deferred_checks(); });
  EXPECT_NE(e.find("label 7 at row 1 is outside [0, 3)"), std::string::npos) << e;
  graph.replay();
  EXPECT_NO_THROW(run_deferred_checks()) << "the good replay's own evidence";
}

// A host wait inside the captured work (reading a tensor) ends the capture with the reason; the graph is
// not ready and the GPU goes on working.
TEST(CudaGraphTest, AHostWaitFailsTheCaptureWithTheReason) {
  RT_REQUIRE_CUDA();
  CudaGraph graph;
  const std::string why = graph.capture(kGpu, [] { (void)Tensor::ones(Shape{4}, DType::F32, kGpu).to_vector(); });
  EXPECT_FALSE(why.empty());
  EXPECT_FALSE(graph.ready());
  EXPECT_THROW(graph.replay(), Error);
  const Tensor one = Tensor::ones(Shape{4}, DType::F32, kGpu);
  EXPECT_EQ(add(one, one).to_vector(), std::vector<double>(4, 2.0));
}

TEST(CudaVsCpuMisc, Tf32MatmulStaysWithinItsPrecision) {
  RT_REQUIRE_CUDA();
  set_allow_tf32(true);
  Tensor a = Tensor::uniform(Shape{128, 256}, -1, 1, 8), b = Tensor::uniform(Shape{256, 64}, -1, 1, 9);
  // TF32 keeps 10 mantissa bits: relative error per product ~1e-3, sums of 256 terms ~1e-2 absolute.
  EXPECT_TRUE(all_close(matmul(a.to(kGpu), b.to(kGpu)).to(Device::cpu()), matmul(a, b), 1e-2, 5e-2));
}

TEST(CudaVsCpuMisc, CrossEntropyAndItsLabelCheck) {
  RT_REQUIRE_CUDA();
  Tensor logits = Tensor::uniform(Shape{64, 10}, -3, 3, 6);
  Tensor labels = Tensor::from_vector(std::vector<double>(64, 3.0), Shape{64}, DType::I64);
  Tensor lc = logits.clone().set_requires_grad(), lg = logits.to(kGpu).set_requires_grad();
  Tensor loss_c = cross_entropy(lc, labels, 0.1), loss_g = cross_entropy(lg, labels.to(kGpu), 0.1);
  EXPECT_NEAR(loss_g.item(), loss_c.item(), 1e-5);
  loss_c.backward();
  loss_g.backward();
  EXPECT_TRUE(all_close(lg.grad().to(Device::cpu()), lc.grad(), 1e-5, 1e-6));
  // The label check reads its device flag at the next host read (the loss), not at the op.
  Tensor bad = Tensor::from_vector(std::vector<double>(64, 10.0), Shape{64}, DType::I64, kGpu);
  EXPECT_THROW(cross_entropy(lg, bad).item(), Error);
  EXPECT_EQ(deferred_checks_pending(), 0u);
}

TEST(CudaVsCpuMisc, CachingAllocatorReusesAndReportsOnDevice) {
  RT_REQUIRE_CUDA();
  empty_cache(kGpu);
  cuda_allocator(0).reset_peak();
  const AllocatorStats before = memory_stats(kGpu);
  { Tensor t = Tensor::empty(Shape{1 << 20}, DType::F32, kGpu); }
  { Tensor t = Tensor::empty(Shape{1 << 20}, DType::F32, kGpu); }
  const AllocatorStats after = memory_stats(kGpu);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.num_cache_hits, before.num_cache_hits + 1);
  EXPECT_GE(after.peak_allocated_bytes, 4 << 20);
  try {
    Tensor::empty(Shape{int64_t{1} << 40}, DType::F32, kGpu);  // 4 TiB
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on cuda:0"), std::string::npos) << e.what();
  }
}

TEST(CudaVsCpuMisc, StreamsAndEventsOrderWork) {
  RT_REQUIRE_CUDA();
  Stream side = Stream::create(kGpu);
  Event done = Event::create(kGpu);
  Tensor a = Tensor::ones(Shape{1 << 20}, DType::F32, kGpu);
  Stream previous = current_stream();
  set_current_stream(side);
  Tensor b = mul(a, 3.0);
  done.record(side);
  set_current_stream(previous);
  done.wait_on(previous);
  EXPECT_EQ(sum(b).item(), 3.0 * (1 << 20));
}

// 61 parameters (more than one launch's 48) of assorted sizes, three steps, f32 and bf16: the optimizer
// made by `make` updates CPU and GPU copies alike. The last 13 parameters get no gradient at the first
// step, so per-parameter state starts at different steps.
void check_fused_optimizer(const std::function<std::unique_ptr<Optimizer>(std::vector<NamedParameter>)>& make,
                           double f32_tol) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    std::vector<NamedParameter> cpu, gpu;
    for (int i = 0; i < 61; ++i) {
      const Shape shape = i % 3 == 0 ? Shape{int64_t{1} + i * 997} : Shape{4, int64_t{1} + i};
      Tensor p = Tensor::uniform(shape, -1, 1, 300 + static_cast<uint64_t>(i), DType::F64).to(dtype);
      std::string name = "p";  // not "p" + std::to_string(i): GCC 12's -Wrestrict false positive
      name += std::to_string(i);
      cpu.push_back({name, p.clone().set_requires_grad()});
      gpu.push_back({name, p.to(kGpu).set_requires_grad()});
    }
    auto cpu_opt = make(cpu), gpu_opt = make(gpu);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < cpu.size(); ++i) {
        if (step == 0 && i >= 48) continue;
        Tensor g =
            Tensor::uniform(cpu[i].tensor.shape(), -1, 1, 900 + 100 * static_cast<uint64_t>(step) + i, DType::F64)
                .to(dtype);
        cpu[i].tensor.set_grad(g);
        gpu[i].tensor.set_grad(g.to(kGpu));
      }
      cpu_opt->step(0.1);
      gpu_opt->step(0.1);
    }
    const double tol = dtype == DType::F32 ? f32_tol : 1e-2;  // the GPU may contract a * b + c into an FMA
    for (size_t i = 0; i < cpu.size(); ++i)
      EXPECT_TRUE(all_close(gpu[i].tensor.to(Device::cpu()), cpu[i].tensor, tol, tol))
          << cpu[i].name << " " << dtype_name(dtype);
    auto cpu_state = cpu_opt->state(), gpu_state = gpu_opt->state();
    ASSERT_EQ(cpu_state.size(), gpu_state.size());
    for (size_t i = 0; i < cpu_state.size(); ++i)
      EXPECT_TRUE(all_close(gpu_state[i].second.to(Device::cpu()), cpu_state[i].second, tol, tol))
          << cpu_state[i].first;
  }
}

TEST(CudaVsCpuMisc, FusedSgdMatchesTheCpuAcrossLaunchChunks) {
  RT_REQUIRE_CUDA();
  check_fused_optimizer(
      [](std::vector<NamedParameter> p) {
        return std::make_unique<Sgd>(std::move(p), SgdOptions{.momentum = 0.9, .nesterov = true, .weight_decay = 1e-3});
      },
      1e-6);
}

TEST(CudaVsCpuMisc, FusedAdamWMatchesTheCpuAcrossLaunchChunks) {
  RT_REQUIRE_CUDA();
  check_fused_optimizer(
      [](std::vector<NamedParameter> p) {
        return std::make_unique<AdamW>(std::move(p), AdamWOptions{.beta1 = 0.85,
                                                                  .beta2 = 0.99,
                                                                  .eps = 1e-6,
                                                                  .weight_decay = 0.05,
                                                                  .decay_policy = DecayPolicy::ExceptBiasAndNorm});
      },
      1e-5);  // m / sqrt(v) amplifies FMA-contraction differences in the moments
}

TEST(CudaVsCpuMisc, OptimizerStateLeftOnTheCpuIsAnErrorNotACrash) {
  RT_REQUIRE_CUDA();
  // The optimizer's first step makes its state beside the parameter; moving the parameter to the GPU
  // in place afterwards (as Module::to does) must not hand the fused kernel host memory.
  Tensor w = Tensor::ones(Shape{5}).set_requires_grad();
  AdamW opt({{"w", w}}, AdamWOptions{});
  w.set_grad(Tensor::ones(Shape{5}));
  opt.step(0.1);
  Tensor moved = w.detach().to(kGpu);
  w.impl()->storage = moved.impl()->storage;
  w.impl()->offset_bytes = moved.impl()->offset_bytes;
  w.zero_grad();
  w.set_grad(Tensor::ones(Shape{5}, DType::F32, kGpu));
  try {
    opt.step(0.1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("state 'w.exp_avg'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(opt.steps(), 1) << "a refused step changes nothing";
}

TEST(CudaVsCpuMisc, FusedUnscaleMatchesTheCpuAndFindsOneInfAmongManyTensors) {
  RT_REQUIRE_CUDA();
  // 100 gradients, 50 f32 and 50 f16: each dtype group takes two launches (48 tensors each at most).
  // An inf planted in the second launch of the f16 group must be found on the GPU, and without it both
  // devices unscale to the same values.
  for (bool plant_inf : {false, true}) {
    std::vector<Tensor> cpu, gpu;
    for (int i = 0; i < 100; ++i) {
      const DType dtype = i % 2 == 0 ? DType::F32 : DType::F16;
      Tensor g =
          Tensor::uniform(Shape{int64_t{1} + i * 131}, -8, 8, 500 + static_cast<uint64_t>(i), DType::F64).to(dtype);
      if (plant_inf && i == 99) g.slice(7000, 7001).fill_(std::numeric_limits<double>::infinity());
      Tensor pc = Tensor::zeros(g.shape(), dtype).set_requires_grad(),
             pg = Tensor::zeros(g.shape(), dtype, kGpu).set_requires_grad();
      pc.set_grad(g.clone());
      pg.set_grad(g.to(kGpu));
      cpu.push_back(pc);
      gpu.push_back(pg);
    }
    GradScaler scaler({.init_scale = 4.0});
    EXPECT_EQ(scaler.unscale(cpu), !plant_inf);
    EXPECT_EQ(scaler.unscale(gpu), !plant_inf);
    if (!plant_inf) {
      for (size_t i = 0; i < cpu.size(); ++i)
        EXPECT_TRUE(all_close(gpu[i].grad().to(Device::cpu()), cpu[i].grad(), 0, 0)) << i;
    }
  }
}

TEST(CudaVsCpuMisc, GradNormIsTheCpusBitsAndClipsTheSame) {
  RT_REQUIRE_CUDA();
  // The fixed-point norm is exact on either device: the same bits from the GPU's atomics as from the CPU's
  // threads, over f32 and f16 gradients of many sizes (several launches), and the same clipped values.
  std::vector<Tensor> cpu, gpu;
  for (int i = 0; i < 60; ++i) {
    const DType dtype = i % 3 == 0 ? DType::F16 : DType::F32;
    Tensor g = Tensor::normal(Shape{int64_t{1} + i * 977}, 0, std::pow(10.0, i % 9 - 4), 900 + static_cast<uint64_t>(i),
                              DType::F64)
                   .to(dtype);
    Tensor pc = Tensor::zeros(g.shape(), dtype).set_requires_grad(),
           pg = Tensor::zeros(g.shape(), dtype, kGpu).set_requires_grad();
    pc.set_grad(g.clone());
    pg.set_grad(g.to(kGpu));
    cpu.push_back(pc);
    gpu.push_back(pg);
  }
  const double norm = grad_norm(cpu);
  EXPECT_EQ(grad_norm(gpu), norm);
  EXPECT_EQ(clip_grad_norm(gpu, norm / 3), norm);
  EXPECT_EQ(clip_grad_norm(cpu, norm / 3), norm);
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_TRUE(all_close(gpu[i].grad().to(Device::cpu()), cpu[i].grad(), 0, 0)) << i;
  gpu[5].grad().slice(3, 4).fill_(std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(std::isnan(grad_norm(gpu)));
}

}  // namespace
}  // namespace ringtrain
