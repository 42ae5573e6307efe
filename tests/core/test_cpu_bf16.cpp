// bf16 on the CPU: convolutions and GEMMs on every path this CPU has (f32 through conversion,
// avx512_bf16, AMX) against f64 references computed from the same bf16 values; the path choice forced
// and refused; the bf16 element-wise, batch-norm and pooling loops against the f32 kernels' results
// rounded once (the bits the portable loops gave before the bf16 loops were compiled per ISA).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "test_util.h"

namespace ringtrain {
namespace {

// Forces a bf16 path for a scope and puts the previous one back.
struct Bf16Path {
  Bf16Kernels before = cpu_bf16_kernels();
  explicit Bf16Path(const std::string& path) { set_cpu_bf16_path(path); }
  ~Bf16Path() { set_cpu_bf16_path(bf16_path_name(before)); }
};

// The bf16 paths this process can take: f32 always; avx512_bf16 and AMX where the CPU has them (on an
// AMX CPU, avx512_bf16 needs oneDNN capped before its first kernel: the ctest entry
// core.bf16_avx512_path runs CpuBf16Env with RINGTRAIN_CPU_BF16=avx512_bf16 for it).
std::vector<std::string> paths_here() {
  const CpuFeatures& f = cpu_features();
  std::vector<std::string> out{"f32"};
  if (f.avx512_bf16 && !f.amx_bf16) out.emplace_back("avx512_bf16");
  if (f.avx512_bf16 && f.amx_bf16) out.emplace_back("amx");
  return out;
}

// What oneDNN's kernel name must show on a path (bf16 operands) and must not.
void expect_kernel_of_path(const std::string& kernel, const std::string& path) {
  EXPECT_NE(kernel.rfind("ref", 0), 0u) << path << ": oneDNN's reference loops: " << kernel;
  if (path == "f32") {
    EXPECT_EQ(kernel.find("bf16"), std::string::npos) << kernel;
  } else {
    EXPECT_NE(kernel.find("bf16"), std::string::npos) << path << ": " << kernel;
  }
  if (path == "avx512_bf16") {
    EXPECT_EQ(kernel.find("amx"), std::string::npos) << kernel;
  }
}

// |actual - expected| <= roundings 2^-8 |expected| + 1e-4 max|expected|: bf16 roundings of the output
// (half an ulp, 2^-9 relative, each) with f32 accumulation, where expected is exact (f64 of the same bf16
// operands).
::testing::AssertionResult bf16_close(const Tensor& actual, const Tensor& expected, int roundings = 1) {
  const std::vector<double> a = actual.to_vector(), e = expected.to_vector();
  double scale = 0;
  for (double v : e) scale = std::max(scale, std::fabs(v));
  return testing::all_close(a, e, roundings / 256.0, 1e-4 * scale);
}

// A random bf16 tensor (uniform in [-1, 1] rounded) and its exact f64 copy.
struct Bf16Input {
  Tensor bf16, f64;
};
Bf16Input bf16_input(const Shape& shape, uint64_t seed) {
  Tensor b = testing::random_f64(shape, seed).to(DType::BF16);
  return {b, b.to(DType::F64)};
}

struct Case {
  const char* name;
  int64_t n, h, w, c, k, r, s;
  Conv2dParams p;
  bool bias;
};

// ResNet's convolution shapes, scaled down in batch and side: the stem (7x7/2 from 3 channels), 3x3 at
// 16 to 64 channels, the bottleneck's 1x1 expansions and reductions, strided 3x3 and 1x1 downsampling,
// and a biased layer with odd sizes.
const Case kCases[] = {
    {"stem 7x7/2 3->64", 2, 16, 16, 3, 64, 7, 7, {.stride_h = 2, .stride_w = 2, .pad_h = 3, .pad_w = 3}, false},
    {"3x3 16->16", 4, 8, 8, 16, 16, 3, 3, {.pad_h = 1, .pad_w = 1}, false},
    {"3x3 64->64", 2, 8, 8, 64, 64, 3, 3, {.pad_h = 1, .pad_w = 1}, false},
    {"3x3/2 32->64", 2, 9, 9, 32, 64, 3, 3, {.stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}, false},
    {"1x1 64->256", 2, 8, 8, 64, 256, 1, 1, {}, false},
    {"1x1 256->64", 2, 8, 8, 256, 64, 1, 1, {}, false},
    {"1x1/2 64->128", 2, 8, 8, 64, 128, 1, 1, {.stride_h = 2, .stride_w = 2}, false},
    {"3x3 biased odd", 3, 7, 5, 24, 40, 3, 3, {.pad_h = 1, .pad_w = 1}, true},
};

ConvGeometry geometry_of(const Case& c) {
  ConvGeometry g;
  g.n = c.n, g.h = c.h, g.w = c.w, g.c = c.c, g.k = c.k, g.r = c.r, g.s = c.s;
  g.stride_h = c.p.stride_h, g.stride_w = c.p.stride_w, g.pad_h = c.p.pad_h, g.pad_w = c.p.pad_w;
  g.p = (c.h + 2 * c.p.pad_h - c.r) / c.p.stride_h + 1;
  g.q = (c.w + 2 * c.p.pad_w - c.s) / c.p.stride_w + 1;
  return g;
}

TEST(CpuBf16, ConvolutionsMatchTheF64ReferenceOnEveryPath) {
  for (const std::string& path : paths_here()) {
    Bf16Path forced(path);
    for (const Case& c : kCases) {
      SCOPED_TRACE(path + ", " + c.name);
      const Bf16Input x = bf16_input(Shape{c.n, c.h, c.w, c.c}, 1), w = bf16_input(Shape{c.k, c.r, c.s, c.c}, 2);
      const Bf16Input b = bf16_input(Shape{c.k}, 3);
      auto run = [&](const Tensor& xv, const Tensor& wv, const Tensor& bv, const Tensor& up, std::vector<Tensor>& out) {
        Tensor xi = xv.detach().set_requires_grad(), wi = wv.detach().set_requires_grad();
        Tensor bi = c.bias ? bv.detach().set_requires_grad() : Tensor();
        Tensor y = conv2d(xi, wi, bi, c.p);
        y.backward(up);
        out = {y, xi.grad(), wi.grad()};
        if (c.bias) out.push_back(bi.grad());
      };
      std::vector<Tensor> ref, got;
      const ConvGeometry g = geometry_of(c);
      const Bf16Input up = bf16_input(Shape{c.n, g.p, g.q, c.k}, 4);
      run(x.f64, w.f64, b.f64, up.f64, ref);
      run(x.bf16, w.bf16, b.bf16, up.bf16, got);
      const char* what[] = {"y", "dx", "dw", "dbias"};
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_EQ(got[i].dtype(), DType::BF16) << what[i];
        EXPECT_TRUE(bf16_close(got[i], ref[i])) << what[i];
      }
      for (int pass = 0; pass < 3; ++pass)
        expect_kernel_of_path(cpu_convolution_kernel(g, DType::BF16, c.bias, pass), path);
    }
  }
}

// The GEMM through the ops that call it: matmul (plain, folded leading dims, batched), linear (a
// transposed weight), their backward passes (the transposed products), on every path.
TEST(CpuBf16, GemmsMatchTheF64ReferenceOnEveryPath) {
  for (const std::string& path : paths_here()) {
    Bf16Path forced(path);
    SCOPED_TRACE(path);
    struct Shapes {
      Shape a, b;
    };
    for (const Shapes& s : {Shapes{Shape{33, 70}, Shape{70, 17}}, Shapes{Shape{3, 5, 64}, Shape{64, 48}},
                            Shapes{Shape{4, 9, 32}, Shape{4, 32, 20}}}) {
      const Bf16Input a = bf16_input(s.a, 5), b = bf16_input(s.b, 6);
      auto run = [&](const Tensor& av, const Tensor& bv, std::vector<Tensor>& out) {
        Tensor ai = av.detach().set_requires_grad(), bi = bv.detach().set_requires_grad();
        Tensor y = matmul(ai, bi);
        y.backward(testing::random_f64(y.shape(), 7).to(DType::BF16).to(av.dtype()));
        out = {y, ai.grad(), bi.grad()};
      };
      std::vector<Tensor> ref, got;
      run(a.f64, b.f64, ref);
      run(a.bf16, b.bf16, got);
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_TRUE(bf16_close(got[i], ref[i])) << s.a.str() << " x " << s.b.str() << " #" << i;
    }
    // linear: x (N, in) and weight (out, in) with a bias, as the classifier head (the product and the bias
    // sum are rounded to bf16 each).
    const Bf16Input x = bf16_input(Shape{8, 96}, 8), w = bf16_input(Shape{10, 96}, 9), bias = bf16_input(Shape{10}, 10);
    EXPECT_TRUE(bf16_close(linear(x.bf16, w.bf16, bias.bf16), linear(x.f64, w.f64, bias.f64), 2));
    const std::string kernel = cpu_gemm_kernel(DType::BF16, 256, 1000, 2048);
    if (path == "f32") {
      EXPECT_TRUE(kernel.rfind("onednn ", 0) == 0 && kernel.ends_with(" (through f32)")) << kernel;
    } else {
      ASSERT_EQ(kernel.rfind("onednn ", 0), 0u) << kernel;
      expect_kernel_of_path(kernel.substr(7), path);
    }
  }
  // f32 on oneDNN's JIT matmul (on the OpenMP threads every other kernel uses), never its reference loops; f64
  // on OpenBLAS.
  const std::string f32 = cpu_gemm_kernel(DType::F32, 256, 384, 96);
  EXPECT_EQ(f32.rfind("onednn ", 0), 0u) << f32;
  EXPECT_EQ(f32.find("ref"), std::string::npos) << f32;
  EXPECT_EQ(cpu_gemm_kernel(DType::F16, 4, 4, 4), cpu_gemm_kernel(DType::F32, 4, 4, 4) + " (through f32)");
  EXPECT_EQ(cpu_gemm_kernel(DType::F64, 4, 4, 4), "openblas");
}

// alpha, beta and leading dimensions wider than the matrix, straight through the kernel table: C =
// alpha op(A) op(B) + beta C with op a transpose, as a user's kernel call may ask.
TEST(CpuBf16, GemmKernelHonoursAlphaBetaTransposesAndStrides) {
  for (const std::string& path : paths_here()) {
    Bf16Path forced(path);
    SCOPED_TRACE(path);
    const int64_t m = 6, n = 5, k = 7, lda = 9, ldb = 8, ldc = 7;  // A^T stored (k, lda), B^T stored (n, ldb)
    const Bf16Input a = bf16_input(Shape{k, lda}, 11), b = bf16_input(Shape{n, ldb}, 12),
                    c = bf16_input(Shape{m, ldc}, 13);
    GemmArgs g;
    g.trans_a = g.trans_b = true;
    g.m = m, g.n = n, g.k = k, g.alpha = 2.0, g.beta = 0.5, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
    Tensor out = c.bf16.clone();
    cpu_kernels().gemm(g, a.bf16, b.bf16, out, 1, 0, 0, 0);
    const std::vector<double> av = a.f64.to_vector(), bv = b.f64.to_vector(), cv = c.f64.to_vector();
    std::vector<double> want = cv;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < k; ++l)
          acc += av[static_cast<size_t>(l * lda + i)] * bv[static_cast<size_t>(j * ldb + l)];
        want[static_cast<size_t>(i * ldc + j)] = 2.0 * acc + 0.5 * cv[static_cast<size_t>(i * ldc + j)];
      }
    EXPECT_TRUE(bf16_close(out, Tensor::from_vector(want, Shape{m, ldc})));
  }
}

TEST(CpuBf16, ForcingAPathThisCpuLacksIsRefusedNamingTheInstruction) {
  const CpuFeatures& f = cpu_features();
  Bf16Path keep("auto");
  EXPECT_EQ(cpu_half_path(DType::BF16).path, f.avx512_bf16 ? (f.amx_bf16 ? "amx" : "avx512_bf16") : "f32");
  set_cpu_bf16_path("f32");
  EXPECT_EQ(cpu_half_path(DType::BF16).path, "f32");
  if (!f.avx512_bf16) {
    const std::string e = testing::error_of([] { set_cpu_bf16_path("avx512_bf16"); });
    EXPECT_NE(e.find("this CPU has no avx512_bf16 instructions"), std::string::npos) << e;
  }
  if (!f.amx_bf16) {
    const std::string e = testing::error_of([] { set_cpu_bf16_path("amx"); });
    EXPECT_NE(e.find("amx: this CPU has no amx_bf16 instructions"), std::string::npos) << e;
  }
  const std::string e = testing::error_of([] { set_cpu_bf16_path("avx2"); });
  EXPECT_NE(e.find("'avx2' is not a CPU bf16 path: use auto, f32, avx512_bf16 or amx"), std::string::npos) << e;
  EXPECT_EQ(cpu_half_path(DType::BF16).path, "f32") << "a refused choice changed the path";
}

// RINGTRAIN_CPU_BF16 as the ctest entry core.bf16_avx512_path sets it: the avx512_bf16 kernels without
// AMX, or a refusal naming the missing instruction on a CPU without avx512_bf16.
TEST(CpuBf16Env, TheEnvironmentForcesThePath) {
  const char* env = std::getenv("RINGTRAIN_CPU_BF16");
  if (!env) GTEST_SKIP() << "RINGTRAIN_CPU_BF16 unset: the ctest entry core.bf16_avx512_path runs this";
  ASSERT_EQ(std::string(env), "avx512_bf16");
  if (!cpu_features().avx512_bf16) {
    const std::string e = testing::error_of([] { cpu_bf16_kernels(); });
    EXPECT_NE(e.find("RINGTRAIN_CPU_BF16=avx512_bf16: this CPU has no avx512_bf16 instructions"), std::string::npos)
        << e;
    return;
  }
  EXPECT_EQ(cpu_half_path(DType::BF16).path, "avx512_bf16");
  for (const Case& c : kCases)
    for (int pass = 0; pass < 3; ++pass)
      expect_kernel_of_path(cpu_convolution_kernel(geometry_of(c), DType::BF16, c.bias, pass), "avx512_bf16");
}

// ---- the bf16 loops compiled per ISA: the f32 kernels' values, rounded once to nearest even

std::vector<uint16_t> bits_of(const Tensor& t) {
  const BFloat16* p = t.data<BFloat16>();
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = p[i].bits;
  return out;
}
// The f32 tensor rounded by the scalar formula (core/dtype.h), not by the kernels under test.
std::vector<uint16_t> rounded_bits(const Tensor& f32) {
  const float* p = f32.data<float>();
  std::vector<uint16_t> out(static_cast<size_t>(f32.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = f32_to_bf16(p[i]).bits;
  return out;
}
Tensor bf16_of_bits(const std::vector<uint16_t>& bits) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(bits.size())}, DType::BF16);
  for (size_t i = 0; i < bits.size(); ++i) t.data<BFloat16>()[i].bits = bits[i];
  return t;
}

TEST(CpuBf16, ElementwiseLoopsGiveTheScalarFormulasBits) {
  // Specials (NaN, infinities, zeros, the largest finite, subnormals, ties) then random values; 1000
  // elements leave vector tails.
  std::vector<uint16_t> a{0x7fc0, 0x7f81, 0x7f80, 0xff80, 0x0000, 0x8000, 0x7f7f, 0x0001, 0x8001, 0x3f80, 0xbf80};
  std::vector<uint16_t> b{0x3f80, 0x3f80, 0xff80, 0x7f80, 0x8000, 0x8000, 0x7f7f, 0x0001, 0x0001, 0x3b80, 0x3b80};
  const Tensor ra = testing::random_f64(Shape{989}, 21, -4, 4).to(DType::BF16);
  const Tensor rb = testing::random_f64(Shape{989}, 22, -4, 4).to(DType::BF16);
  for (uint16_t v : bits_of(ra)) a.push_back(v);
  for (uint16_t v : bits_of(rb)) b.push_back(v);
  const Tensor ta = bf16_of_bits(a), tb = bf16_of_bits(b);
  const Tensor fa = ta.to(DType::F32), fb = tb.to(DType::F32);
  EXPECT_EQ(bits_of(add(ta, tb)), rounded_bits(add(fa, fb)));
  EXPECT_EQ(bits_of(mul(ta, tb)), rounded_bits(mul(fa, fb)));
  EXPECT_EQ(bits_of(relu(ta)), rounded_bits(relu(fa)));
  // f32 -> bf16 itself: values that round up, down, to even at ties, overflow to inf, and NaN.
  std::vector<double> wide{1.0 + 1.0 / 256,
                           1.0 + 3.0 / 512,
                           1.0 + 1.0 / 512,
                           3.3895313892515355e38,
                           -0.0,
                           std::numeric_limits<double>::quiet_NaN(),
                           1e-40};
  for (double v : testing::random_f64(Shape{1000}, 23, -1e3, 1e3).to_vector()) wide.push_back(v);
  const Tensor f32 = Tensor::from_vector(wide, Shape{static_cast<int64_t>(wide.size())}).to(DType::F32);
  EXPECT_EQ(bits_of(f32.to(DType::BF16)), rounded_bits(f32));
  // bf16 -> f32 is exact.
  const std::vector<double> back = ta.to(DType::F32).to_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isnan(back[i])) {
      EXPECT_EQ(back[i], static_cast<double>(bf16_to_f32(BFloat16{a[i]}))) << i;
    }
  }
}

// The relu's gradient: dy where the input was positive, else +0.
TEST(CpuBf16, ReluGradientSelectsLikeTheF32Kernel) {
  const Tensor x = testing::random_f64(Shape{1037}, 24).to(DType::BF16),
               dy = testing::random_f64(Shape{1037}, 25).to(DType::BF16);
  auto grad_of = [&](DType t) {
    Tensor xi = x.to(t).detach().set_requires_grad();
    relu(xi).backward(dy.to(t));
    return xi.grad();
  };
  EXPECT_EQ(bits_of(grad_of(DType::BF16)), rounded_bits(grad_of(DType::F32)));
}

// Batch norm's bf16 rows (statistics, the fused residual add and ReLU, the backward's sums and dx) are the
// f32 rows with widened loads and one rounded store: the f32 kernels on the same values, rounded, give
// the same bits, and the f32 parameters' gradients are equal.
TEST(CpuBf16, BatchNormLoopsGiveTheF32KernelsRoundedBits) {
  const int64_t M = 600, C = 40;  // rows cross the 256-row blocks; 40 channels leave vector tails
  const Tensor x = testing::random_f64(Shape{M, C}, 31, -2, 3).to(DType::BF16);
  const Tensor res = testing::random_f64(Shape{M, C}, 32).to(DType::BF16);
  const Tensor dy = testing::random_f64(Shape{M, C}, 33).to(DType::BF16);
  const Tensor gamma = testing::random_f64(Shape{C}, 34, 0.5, 1.5).to(DType::F32);
  const Tensor beta = testing::random_f64(Shape{C}, 35).to(DType::F32);
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "relu(bn(x) + residual)" : "bn(x)");
    auto run = [&](DType t, std::vector<Tensor>& out) {
      Tensor xi = x.to(t).detach().set_requires_grad(), g = gamma.detach().set_requires_grad();
      Tensor b = beta.detach().set_requires_grad();
      Tensor rm = Tensor::zeros(Shape{C}), rv = Tensor::ones(Shape{C});
      Tensor y = batch_norm(xi, g, b, rm, rv, true, 0.1, 1e-5, fused, fused ? res.to(t) : Tensor());
      y.backward(dy.to(t));
      out = {y, xi.grad(), g.grad(), b.grad(), rm, rv};
    };
    std::vector<Tensor> h, f;
    run(DType::BF16, h);
    run(DType::F32, f);
    EXPECT_EQ(bits_of(h[0]), rounded_bits(f[0])) << "y";
    EXPECT_EQ(bits_of(h[1]), rounded_bits(f[1])) << "dx";
    for (size_t i = 2; i < h.size(); ++i) EXPECT_EQ(h[i].to_vector(), f[i].to_vector()) << "parameter tensor " << i;
  }
}

// The fused BN + ReLU backward's bf16 mask (core/cpu/norm_pool.cpp) is one compare: a positive f32 rounds
// to a positive bf16 exactly when it exceeds the subnormal of bits 0x8000, which itself ties to zero.
TEST(CpuBf16, OneCompareTellsWhichValuesRoundToAPositiveBf16) {
  const float above = bits_f32(0x8000u);
  for (uint32_t bits = 0; bits < 0x20000u; ++bits) {
    const float v = bits_f32(bits);
    ASSERT_EQ(bf16_to_f32(f32_to_bf16(v)) > 0.0f, v > above) << "f32 bits " << bits;
  }
  for (float v : {1e-38f, 1.0f, 3e38f, std::numeric_limits<float>::infinity()})
    EXPECT_TRUE(bf16_to_f32(f32_to_bf16(v)) > 0.0f && v > above) << v;
}

// Max pooling keeps one of its inputs: bf16 gives the f32 kernel's values exactly, and its gradient is
// the f32 one rounded (a sum where windows overlap).
TEST(CpuBf16, MaxPoolMatchesTheF32Kernel) {
  const Tensor x = testing::random_f64(Shape{2, 11, 11, 40}, 41).to(DType::BF16);
  auto run = [&](DType t, std::vector<Tensor>& out) {
    Tensor xi = x.to(t).detach().set_requires_grad();
    Tensor y = max_pool2d(xi, {.kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1});
    y.backward(testing::random_f64(y.shape(), 42).to(DType::BF16).to(t));
    out = {y, xi.grad()};
  };
  std::vector<Tensor> h, f;
  run(DType::BF16, h);
  run(DType::F32, f);
  EXPECT_EQ(bits_of(h[0]), rounded_bits(f[0]));
  EXPECT_EQ(bits_of(h[1]), rounded_bits(f[1]));
}

}  // namespace
}  // namespace ringtrain
