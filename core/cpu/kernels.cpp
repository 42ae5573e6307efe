// core/cpu/kernels.cpp: the CPU kernel table. Kernels run on the thread pool (core/parallel.h); the
// hot f32 loops are compiled for AVX-512, AVX2 and baseline x86-64 with runtime selection
// (target_clones). Results never depend on the thread count: reductions use fixed-size blocks combined
// in a fixed order, and random kernels are counter-based.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"
#include "core/philox.h"

namespace ringtrain {
namespace {

constexpr int64_t kGrain = 1 << 14;         // elements per task for cheap elementwise work
constexpr int64_t kReduceBlock = 1 << 12;   // fixed block for thread-count-independent sums

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<storage type>) for the tensor's dtype.
template <typename Fn>
void visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: fn(TypeTag<float>{}); return;
    case DType::F64: fn(TypeTag<double>{}); return;
    case DType::F16: fn(TypeTag<Half>{}); return;
    case DType::BF16: fn(TypeTag<BFloat16>{}); return;
    case DType::I32: fn(TypeTag<int32_t>{}); return;
    case DType::I64: fn(TypeTag<int64_t>{}); return;
    case DType::U8: fn(TypeTag<uint8_t>{}); return;
  }
  RT_THROW("unknown dtype");
}

template <typename Fn>
void visit_floating(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::F32: fn(TypeTag<float>{}); return;
    case DType::F64: fn(TypeTag<double>{}); return;
    case DType::F16: fn(TypeTag<Half>{}); return;
    case DType::BF16: fn(TypeTag<BFloat16>{}); return;
    default: RT_THROW("op '", op, "' has no CPU kernel for dtype ", dtype_name(dtype));
  }
}

// ---------------------------------------------------------------------------------------------------
// Vectorized f32 hot loops (one binary per ISA, picked at load time).

#define RT_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))

RT_MULTIVERSION void f32_add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
RT_MULTIVERSION void f32_mul(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}
RT_MULTIVERSION void f32_axpb(const float* x, float alpha, float beta, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * alpha + beta;
}
RT_MULTIVERSION void f32_relu(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
RT_MULTIVERSION void f32_relu_grad(const float* g, const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] > 0.0f ? g[i] : 0.0f;
}
// Sum with 16 independent lanes (vectorizable, fixed order for a given n).
RT_MULTIVERSION double f32_sum_block(const float* x, int64_t n) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += x[i + l];
  double total = 0.0;
  for (int l = 0; l < 16; ++l) total += lanes[l];
  for (; i < n; ++i) total += x[i];
  return total;
}

// ---------------------------------------------------------------------------------------------------
// fill / convert / random

void cpu_fill(Tensor& out, double value) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    const S v = store_as<S>(static_cast<compute_t<S>>(value));
    S* p = out.data<S>();
    parallel_for(out.numel(), kGrain, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, v); });
  });
}

void cpu_convert(const Tensor& src, Tensor& dst) {
  visit_dtype(src.dtype(), [&](auto src_tag) {
    using A = typename decltype(src_tag)::type;
    visit_dtype(dst.dtype(), [&](auto dst_tag) {
      using B = typename decltype(dst_tag)::type;
      const A* in = src.data<A>();
      B* out = dst.data<B>();
      parallel_for(src.numel(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          if constexpr (std::is_same_v<A, B>) {
            out[i] = in[i];
          } else if constexpr (std::is_integral_v<A> && std::is_integral_v<B>) {
            out[i] = static_cast<B>(in[i]);  // exact for i64 beyond 2^53; narrowing wraps
          } else if constexpr (std::is_integral_v<B> && !std::is_integral_v<A>) {
            // floating -> integer truncates toward zero (through int64 so u8 wraps, never UB in range)
            out[i] = static_cast<B>(static_cast<int64_t>(load_as<double>(in[i])));
          } else {
            out[i] = store_as<B>(load_as<double>(in[i]));
          }
        }
      });
    });
  });
}

void cpu_uniform(Tensor& out, uint64_t seed, uint64_t stream, double low, double high) {
  visit_floating(out.dtype(), "uniform", [&](auto tag) {
    using S = typename decltype(tag)::type;
    S* p = out.data<S>();
    parallel_for(out.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        // philox gives (0, 1]; 1 - u is in [0, 1) so the range is [low, high).
        if constexpr (std::is_same_v<S, double>) {
          p[i] = low + (high - low) * (1.0 - philox_uniform_f64(seed, stream, static_cast<uint64_t>(i)));
        } else {
          float u = 1.0f - philox_uniform(seed, stream, static_cast<uint64_t>(i));
          p[i] = store_as<S>(static_cast<float>(low + (high - low) * static_cast<double>(u)));
        }
      }
    });
  });
}

void cpu_normal(Tensor& out, uint64_t seed, uint64_t stream, double mean, double stddev) {
  visit_floating(out.dtype(), "normal", [&](auto tag) {
    using S = typename decltype(tag)::type;
    S* p = out.data<S>();
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    parallel_for(out.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const uint64_t j = 2 * static_cast<uint64_t>(i);
        if constexpr (std::is_same_v<S, double>) {
          double u1 = philox_uniform_f64(seed, stream, j), u2 = philox_uniform_f64(seed, stream, j + 1);
          p[i] = mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
        } else {
          float u1 = philox_uniform(seed, stream, j), u2 = philox_uniform(seed, stream, j + 1);
          float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(static_cast<float>(kTwoPi) * u2);
          p[i] = store_as<S>(static_cast<float>(mean + stddev * static_cast<double>(z)));
        }
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// unary / scalar

template <typename C, typename Fn>
void with_unary(UnaryOp op, Fn&& fn) {
  switch (op) {
    case UnaryOp::Neg: fn([](C x) { return static_cast<C>(-x); }); return;
    case UnaryOp::Relu: fn([](C x) { return x > C(0) ? x : C(0); }); return;
    case UnaryOp::Abs: fn([](C x) { return x < C(0) ? static_cast<C>(-x) : x; }); return;
    case UnaryOp::Exp:
      if constexpr (std::is_floating_point_v<C>) fn([](C x) { return std::exp(x); });
      return;
    case UnaryOp::Log:
      if constexpr (std::is_floating_point_v<C>) fn([](C x) { return std::log(x); });
      return;
    case UnaryOp::Sqrt:
      if constexpr (std::is_floating_point_v<C>) fn([](C x) { return std::sqrt(x); });
      return;
    case UnaryOp::Tanh:
      if constexpr (std::is_floating_point_v<C>) fn([](C x) { return std::tanh(x); });
      return;
    case UnaryOp::Sigmoid:
      if constexpr (std::is_floating_point_v<C>) fn([](C x) { return C(1) / (C(1) + std::exp(-x)); });
      return;
  }
}

void cpu_unary(UnaryOp op, const Tensor& x, Tensor& out) {
  const int64_t n = x.numel();
  if (x.dtype() == DType::F32 && op == UnaryOp::Relu) {
    const float* in = x.data<float>();
    float* o = out.data<float>();
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) { f32_relu(in + b, o + b, e - b); });
    return;
  }
  visit_dtype(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* in = x.data<S>();
    S* o = out.data<S>();
    bool ran = false;
    with_unary<C>(op, [&](auto fn) {
      ran = true;
      parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = store_as<S>(fn(load_as<C>(in[i])));
      });
    });
    if (!ran) RT_THROW("unary op ", static_cast<int>(op), " has no CPU kernel for dtype ", dtype_name(x.dtype()));
  });
}

void cpu_scalar(ScalarOp op, const Tensor& x, double s, Tensor& out) {
  const int64_t n = x.numel();
  if (x.dtype() == DType::F32 && (op == ScalarOp::Add || op == ScalarOp::Mul || op == ScalarOp::RSub)) {
    const float alpha = op == ScalarOp::Mul ? static_cast<float>(s) : op == ScalarOp::RSub ? -1.0f : 1.0f;
    const float beta = op == ScalarOp::Mul ? 0.0f : static_cast<float>(s);
    const float* in = x.data<float>();
    float* o = out.data<float>();
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) { f32_axpb(in + b, alpha, beta, o + b, e - b); });
    return;
  }
  visit_dtype(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* in = x.data<S>();
    S* o = out.data<S>();
    const C cs = static_cast<C>(s);
    auto run = [&](auto fn) {
      parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = store_as<S>(fn(load_as<C>(in[i])));
      });
    };
    switch (op) {
      case ScalarOp::Add: run([cs](C v) { return static_cast<C>(v + cs); }); break;
      case ScalarOp::Mul:
        if constexpr (std::is_integral_v<C>) run([s](C v) { return static_cast<C>(static_cast<double>(v) * s); });
        else run([cs](C v) { return static_cast<C>(v * cs); });
        break;
      case ScalarOp::RSub: run([cs](C v) { return static_cast<C>(cs - v); }); break;
      case ScalarOp::RDiv:
        if constexpr (std::is_integral_v<C>) RT_THROW("op 'rdiv' has no CPU kernel for integer dtypes");
        else run([cs](C v) { return cs / v; });
        break;
      case ScalarOp::Pow:
        if constexpr (std::is_integral_v<C>) RT_THROW("op 'pow' has no CPU kernel for integer dtypes");
        else run([cs](C v) { return std::pow(v, cs); });
        break;
    }
  });
}

// ---------------------------------------------------------------------------------------------------
// binary with broadcasting

template <typename C, typename Fn>
void with_binary(BinaryOp op, Fn&& fn) {
  switch (op) {
    case BinaryOp::Add: fn([](C a, C b) { return static_cast<C>(a + b); }); return;
    case BinaryOp::Sub: fn([](C a, C b) { return static_cast<C>(a - b); }); return;
    case BinaryOp::Mul: fn([](C a, C b) { return static_cast<C>(a * b); }); return;
    case BinaryOp::Div:
      fn([](C a, C b) {
        if constexpr (std::is_integral_v<C>) {
          if (b == 0) return C(0);  // integer division by zero is defined as 0 (no trap)
        }
        return static_cast<C>(a / b);
      });
      return;
    case BinaryOp::Maximum: fn([](C a, C b) { return (a >= b || a != a) ? a : b; }); return;
    case BinaryOp::Minimum: fn([](C a, C b) { return (a <= b || a != a) ? a : b; }); return;
    case BinaryOp::Eq: fn([](C a, C b) { return C(a == b); }); return;
    case BinaryOp::Ne: fn([](C a, C b) { return C(a != b); }); return;
    case BinaryOp::Lt: fn([](C a, C b) { return C(a < b); }); return;
    case BinaryOp::Le: fn([](C a, C b) { return C(a <= b); }); return;
    case BinaryOp::Gt: fn([](C a, C b) { return C(a > b); }); return;
    case BinaryOp::Ge: fn([](C a, C b) { return C(a >= b); }); return;
    case BinaryOp::ReluGrad: fn([](C g, C x) { return x > C(0) ? g : C(0); }); return;
  }
}

void cpu_binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, const BroadcastDesc& bc) {
  const int64_t n = out.numel();
  const bool same = a.numel() == n && b.numel() == n;
  if (same && a.dtype() == DType::F32 && out.dtype() == DType::F32 &&
      (op == BinaryOp::Add || op == BinaryOp::Mul || op == BinaryOp::ReluGrad)) {
    const float *pa = a.data<float>(), *pb = b.data<float>();
    float* po = out.data<float>();
    parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
      if (op == BinaryOp::Add) f32_add(pa + lo, pb + lo, po + lo, hi - lo);
      else if (op == BinaryOp::Mul) f32_mul(pa + lo, pb + lo, po + lo, hi - lo);
      else f32_relu_grad(pa + lo, pb + lo, po + lo, hi - lo);
    });
    return;
  }
  visit_dtype(a.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* pa = a.data<S>();
    const S* pb = b.data<S>();
    with_binary<C>(op, [&](auto fn) {
      auto kernel = [&](auto* po) {
        using O = std::remove_pointer_t<decltype(po)>;
        if (same) {
          parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) po[i] = store_as<O>(fn(load_as<C>(pa[i]), load_as<C>(pb[i])));
          });
        } else if (b.numel() == 1 && a.numel() == n) {
          const C vb = load_as<C>(pb[0]);
          parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) po[i] = store_as<O>(fn(load_as<C>(pa[i]), vb));
          });
        } else if (a.numel() == 1 && b.numel() == n) {
          const C va = load_as<C>(pa[0]);
          parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) po[i] = store_as<O>(fn(va, load_as<C>(pb[i])));
          });
        } else {
          // General case: an odometer over out's index, offsets into a and b updated incrementally.
          const int nd = bc.ndim;
          parallel_for(n, kGrain / 4, [&](int64_t lo, int64_t hi) {
            int64_t idx[kMaxDims] = {};
            int64_t rem = lo, off_a = 0, off_b = 0;
            for (int d = nd - 1; d >= 0; --d) {
              idx[d] = rem % bc.out_dims[d];
              rem /= bc.out_dims[d];
              off_a += idx[d] * bc.a_stride[d];
              off_b += idx[d] * bc.b_stride[d];
            }
            for (int64_t i = lo; i < hi; ++i) {
              po[i] = store_as<O>(fn(load_as<C>(pa[off_a]), load_as<C>(pb[off_b])));
              for (int d = nd - 1; d >= 0; --d) {
                off_a += bc.a_stride[d];
                off_b += bc.b_stride[d];
                if (++idx[d] < bc.out_dims[d]) break;
                off_a -= bc.a_stride[d] * bc.out_dims[d];
                off_b -= bc.b_stride[d] * bc.out_dims[d];
                idx[d] = 0;
              }
            }
          });
        }
      };
      if (out.dtype() == DType::U8) kernel(out.data<uint8_t>());
      else kernel(out.data<S>());
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// reductions over [outer, n, inner]

void cpu_reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out,
                Tensor* argmax) {
  visit_dtype(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* px = x.data<S>();
    S* po = out.data<S>();
    int64_t* pi = argmax ? argmax->data<int64_t>() : nullptr;
    if (op == ReduceOp::Sum && inner == 1) {
      // Row sums; long rows are split into fixed blocks summed in order (thread-count independent).
      const int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
      std::vector<double> partial(static_cast<size_t>(outer * std::max<int64_t>(blocks, 1)), 0.0);
      parallel_for(outer * blocks, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t row = t / blocks, blk = t % blocks;
          const int64_t begin = blk * kReduceBlock, end = std::min(n, begin + kReduceBlock);
          const S* base = px + row * n;
          double acc = 0.0;
          if constexpr (std::is_same_v<S, float>) {
            acc = f32_sum_block(base + begin, end - begin);
          } else {
            C lane = C(0);
            for (int64_t i = begin; i < end; ++i) lane += load_as<C>(base[i]);
            acc = static_cast<double>(lane);
          }
          partial[static_cast<size_t>(t)] = acc;
        }
      });
      for (int64_t row = 0; row < outer; ++row) {
        if constexpr (std::is_integral_v<C>) {
          C total = 0;
          for (int64_t i = 0; i < n; ++i) total += load_as<C>(px[row * n + i]);
          po[row] = store_as<S>(total);
        } else {
          double total = 0.0;
          for (int64_t blk = 0; blk < blocks; ++blk) total += partial[static_cast<size_t>(row * blocks + blk)];
          po[row] = store_as<S>(static_cast<C>(total));
        }
      }
      return;
    }
    // Column-style reduction: each output (o, j) walks n strided values; parallel over outputs.
    parallel_for(outer * inner, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t o = t / inner, j = t % inner;
        const S* base = px + o * n * inner + j;
        if (op == ReduceOp::Sum) {
          C acc = C(0);
          for (int64_t i = 0; i < n; ++i) acc += load_as<C>(base[i * inner]);
          po[t] = store_as<S>(acc);
        } else {
          C best = load_as<C>(base[0]);
          int64_t best_i = 0;
          for (int64_t i = 1; i < n; ++i) {
            C v = load_as<C>(base[i * inner]);
            // NaN wins and stays (propagates like PyTorch); otherwise strictly greater keeps the first max.
            if (best == best && (v > best || v != v)) {
              best = v;
              best_i = i;
            }
          }
          po[t] = store_as<S>(best);
          if (pi) pi[t] = best_i;
        }
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// GEMM (OpenBLAS; 16-bit types go through f32)

void cpu_gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, Tensor& c, int64_t batch, int64_t stride_a,
              int64_t stride_b, int64_t stride_c) {
  const CBLAS_TRANSPOSE ta = g.trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = g.trans_b ? CblasTrans : CblasNoTrans;
  const blasint m = static_cast<blasint>(g.m), n = static_cast<blasint>(g.n), k = static_cast<blasint>(g.k);
  const blasint lda = static_cast<blasint>(g.lda), ldb = static_cast<blasint>(g.ldb), ldc = static_cast<blasint>(g.ldc);
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    // An empty inner dimension: BLAS may not touch C; make C = beta * C (all batches) explicit.
    if (g.beta == 0.0) cpu_fill(c, 0.0);
    else cpu_scalar(ScalarOp::Mul, c, g.beta, c);
    return;
  }
  switch (a.dtype()) {
    case DType::F32:
      for (int64_t bi = 0; bi < batch; ++bi)
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(g.alpha), a.data<float>() + bi * stride_a, lda,
                    b.data<float>() + bi * stride_b, ldb, static_cast<float>(g.beta), c.data<float>() + bi * stride_c,
                    ldc);
      return;
    case DType::F64:
      for (int64_t bi = 0; bi < batch; ++bi)
        cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, g.alpha, a.data<double>() + bi * stride_a, lda,
                    b.data<double>() + bi * stride_b, ldb, g.beta, c.data<double>() + bi * stride_c, ldc);
      return;
    case DType::F16:
    case DType::BF16: {
      Tensor a32 = Tensor::empty(a.shape(), DType::F32), b32 = Tensor::empty(b.shape(), DType::F32);
      Tensor c32 = Tensor::empty(c.shape(), DType::F32);
      cpu_convert(a, a32);
      cpu_convert(b, b32);
      if (g.beta != 0.0) cpu_convert(c, c32);
      for (int64_t bi = 0; bi < batch; ++bi)
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(g.alpha), a32.data<float>() + bi * stride_a,
                    lda, b32.data<float>() + bi * stride_b, ldb, static_cast<float>(g.beta),
                    c32.data<float>() + bi * stride_c, ldc);
      cpu_convert(c32, c);
      return;
    }
    default: RT_THROW("op 'matmul' has no CPU kernel for dtype ", dtype_name(a.dtype()));
  }
}

// ---------------------------------------------------------------------------------------------------
// softmax family

void cpu_softmax(const Tensor& x, int64_t rows, int64_t cols, bool log, Tensor& out) {
  visit_floating(x.dtype(), "softmax", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* px = x.data<S>();
    S* po = out.data<S>();
    parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const S* in = px + r * cols;
        S* o = po + r * cols;
        C mx = -std::numeric_limits<C>::infinity();
        for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, load_as<C>(in[c]));
        C total = 0;
        for (int64_t c = 0; c < cols; ++c) total += std::exp(load_as<C>(in[c]) - mx);
        if (log) {
          const C lse = mx + std::log(total);
          for (int64_t c = 0; c < cols; ++c) o[c] = store_as<S>(load_as<C>(in[c]) - lse);
        } else {
          const C inv = C(1) / total;
          for (int64_t c = 0; c < cols; ++c) o[c] = store_as<S>(std::exp(load_as<C>(in[c]) - mx) * inv);
        }
      }
    });
  });
}

void cpu_softmax_backward(const Tensor& y, const Tensor& dy, int64_t rows, int64_t cols, bool log, Tensor& dx) {
  visit_floating(y.dtype(), "softmax_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S *py = y.data<S>(), *pdy = dy.data<S>();
    S* pdx = dx.data<S>();
    parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const S *yr = py + r * cols, *gr = pdy + r * cols;
        S* o = pdx + r * cols;
        C dot = 0;
        if (log) {
          for (int64_t c = 0; c < cols; ++c) dot += load_as<C>(gr[c]);
          for (int64_t c = 0; c < cols; ++c)
            o[c] = store_as<S>(load_as<C>(gr[c]) - std::exp(load_as<C>(yr[c])) * dot);
        } else {
          for (int64_t c = 0; c < cols; ++c) dot += load_as<C>(gr[c]) * load_as<C>(yr[c]);
          for (int64_t c = 0; c < cols; ++c) o[c] = store_as<S>(load_as<C>(yr[c]) * (load_as<C>(gr[c]) - dot));
        }
      }
    });
  });
}

template <typename Fn>
void visit_labels(const Tensor& labels, Fn&& fn) {
  if (labels.dtype() == DType::I32) fn(labels.data<int32_t>());
  else fn(labels.data<int64_t>());
}

void cpu_cross_entropy(const Tensor& logits, const Tensor& labels, double smoothing, Tensor& log_probs,
                       Tensor& loss, int64_t* bad_label) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  bool all_valid = true;
  visit_labels(labels, [&](auto* lab) {
    for (int64_t r = 0; r < rows; ++r) {
      if (lab[r] < 0 || lab[r] >= cols) {
        *bad_label = r;
        all_valid = false;
        return;
      }
    }
  });
  if (!all_valid) return;
  cpu_softmax(logits, rows, cols, /*log=*/true, log_probs);
  visit_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    using L = std::conditional_t<std::is_same_v<S, double>, double, float>;
    const S* lp = log_probs.data<S>();
    L* pl = loss.data<L>();
    const C on = C(1) - static_cast<C>(smoothing), off = static_cast<C>(smoothing) / static_cast<C>(cols);
    visit_labels(labels, [&](auto* lab) {
      parallel_for(rows, std::max<int64_t>(1, kGrain / cols), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const S* row = lp + r * cols;
          C total = 0;
          for (int64_t c = 0; c < cols; ++c) total += load_as<C>(row[c]);
          pl[r] = static_cast<L>(-on * load_as<C>(row[lab[r]]) - off * total);
        }
      });
    });
  });
}

void cpu_cross_entropy_backward(const Tensor& log_probs, const Tensor& labels, double smoothing, double scale,
                                Tensor& dlogits) {
  const int64_t rows = log_probs.size(0), cols = log_probs.size(1);
  visit_floating(log_probs.dtype(), "cross_entropy_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* lp = log_probs.data<S>();
    S* d = dlogits.data<S>();
    const C on = C(1) - static_cast<C>(smoothing), off = static_cast<C>(smoothing) / static_cast<C>(cols);
    const C sc = static_cast<C>(scale);
    visit_labels(labels, [&](auto* lab) {
      parallel_for(rows, std::max<int64_t>(1, kGrain / cols), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            C target = off + (c == lab[r] ? on : C(0));
            d[r * cols + c] = store_as<S>(sc * (std::exp(load_as<C>(lp[r * cols + c])) - target));
          }
        }
      });
    });
  });
}

void cpu_dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, Tensor& out, Tensor& mask) {
  visit_floating(x.dtype(), "dropout", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const S* px = x.data<S>();
    S *po = out.data<S>(), *pm = mask.data<S>();
    const C keep_scale = static_cast<C>(1.0 / (1.0 - p));
    const float threshold = static_cast<float>(p);
    parallel_for(x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const C m = philox_uniform(seed, stream, static_cast<uint64_t>(i)) > threshold ? keep_scale : C(0);
        pm[i] = store_as<S>(m);
        po[i] = store_as<S>(load_as<C>(px[i]) * m);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// fused SGD: one pass over each parameter (reads p, g, buf once; writes p, buf once)

void cpu_sgd_multi_tensor(const std::vector<SgdTensor>& tensors, const SgdArgs& a) {
  for (const SgdTensor& t : tensors) {
    visit_floating(t.param->dtype(), "sgd", [&](auto tag) {
      using S = typename decltype(tag)::type;
      using C = compute_t<S>;
      S* p = t.param->data<S>();
      const S* g = t.grad->data<S>();
      S* m = t.momentum ? t.momentum->data<S>() : nullptr;
      const C wd = static_cast<C>(t.weight_decay), mom = static_cast<C>(a.momentum),
              keep = static_cast<C>(1.0 - a.dampening), lr = static_cast<C>(a.lr);
      const bool init = t.init_momentum, nesterov = a.nesterov;
      parallel_for(t.param->numel(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sgd_element<S, C>(p[i], g[i], m ? m + i : nullptr, wd, mom, keep, lr, init, nesterov);
      });
    });
  }
}

// fused AdamW: one pass over each parameter (reads p, g, m, v once; writes p, m, v once)

void cpu_adamw_multi_tensor(const std::vector<AdamWTensor>& tensors, const AdamWArgs& a) {
  for (const AdamWTensor& t : tensors) {
    visit_floating(t.param->dtype(), "adamw", [&](auto tag) {
      using S = typename decltype(tag)::type;
      using C = compute_t<S>;
      S* p = t.param->data<S>();
      const S* g = t.grad->data<S>();
      S* m = t.exp_avg->data<S>();
      S* v = t.exp_avg_sq->data<S>();
      const C decay = static_cast<C>(t.decay), b1 = static_cast<C>(a.beta1), keep1 = static_cast<C>(1.0 - a.beta1),
              b2 = static_cast<C>(a.beta2), keep2 = static_cast<C>(1.0 - a.beta2), eps = static_cast<C>(a.eps),
              step_size = static_cast<C>(t.step_size), inv_bias2 = static_cast<C>(t.inv_bias2);
      const bool init = t.init;
      parallel_for(t.param->numel(), kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i)
          adamw_element<S, C>(p[i], g[i], m[i], v[i], decay, b1, keep1, b2, keep2, eps, step_size, inv_bias2, init);
      });
    });
  }
}

// loss-scale unscaling with the finite check in the same pass

void cpu_unscale_multi_tensor(const std::vector<Tensor*>& grads, double inv_scale, Tensor& found_inf) {
  std::atomic<bool> bad{false};
  for (Tensor* t : grads) {
    visit_floating(t->dtype(), "unscale", [&](auto tag) {
      using S = typename decltype(tag)::type;
      using C = compute_t<S>;
      S* g = t->data<S>();
      const C inv = static_cast<C>(inv_scale);
      parallel_for(t->numel(), kGrain, [&](int64_t lo, int64_t hi) {
        bool finite = true;
        for (int64_t i = lo; i < hi; ++i) {
          const C x = load_as<C>(g[i]) * inv;
          g[i] = store_as<S>(x);
          finite &= std::isfinite(load_as<C>(g[i]));
        }
        if (!finite) bad.store(true, std::memory_order_relaxed);
      });
    });
  }
  if (bad.load()) found_inf.data<float>()[0] = 1.0f;
}

}  // namespace

const KernelTable& cpu_kernels() {
  static const KernelTable table = [] {
    KernelTable t;
    t.fill = cpu_fill;
    t.convert = cpu_convert;
    t.uniform = cpu_uniform;
    t.normal = cpu_normal;
    t.unary = cpu_unary;
    t.binary = cpu_binary;
    t.scalar = cpu_scalar;
    t.reduce = cpu_reduce;
    t.gemm = cpu_gemm;
    t.softmax = cpu_softmax;
    t.softmax_backward = cpu_softmax_backward;
    t.cross_entropy = cpu_cross_entropy;
    t.cross_entropy_backward = cpu_cross_entropy_backward;
    t.dropout = cpu_dropout;
    t.sgd_multi_tensor = cpu_sgd_multi_tensor;
    t.adamw_multi_tensor = cpu_adamw_multi_tensor;
    t.unscale_multi_tensor = cpu_unscale_multi_tensor;
    t.conv2d_forward = cpu::conv2d_forward;
    t.conv2d_backward_data = cpu::conv2d_backward_data;
    t.conv2d_backward_weights = cpu::conv2d_backward_weights;
    t.batch_norm_forward = cpu::batch_norm_forward;
    t.batch_norm_backward = cpu::batch_norm_backward;
    t.max_pool2d_forward = cpu::max_pool2d_forward;
    t.max_pool2d_backward = cpu::max_pool2d_backward;
    t.avg_pool2d_forward = cpu::avg_pool2d_forward;
    t.avg_pool2d_backward = cpu::avg_pool2d_backward;
    return t;
  }();
  return table;
}

}  // namespace ringtrain
