// core/cpu/elementwise.cpp: the CPU element-wise kernels: fill, convert, unary, binary (with
// broadcasting) and scalar ops. They run on the thread pool (core/parallel.h); the hot f32 loops are
// compiled for AVX-512, AVX2 and baseline x86-64 with runtime selection (target_clones). Built with
// -fno-math-errno (core/CMakeLists.txt) so that the Sqrt loop vectorizes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

// ---------------------------------------------------------------------------------------------------
// Vectorized f32 hot loops (RT_MULTIVERSION: core/cpu/cpu_kernels.h).

RT_MULTIVERSION void f32_add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
RT_MULTIVERSION void f32_mul(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}
RT_MULTIVERSION void f32_axpb(const float* x, float alpha, float beta, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * alpha + beta;
}
// relu: +0 where x <= 0 (-0 included), x elsewhere: NaN stays NaN, as in PyTorch and the fused ReLU, so
// a NaN is not hidden from the non-finite checks behind it.
RT_MULTIVERSION void f32_relu(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] <= 0.0f ? 0.0f : x[i];
}
RT_MULTIVERSION void f32_relu_grad(const float* g, const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] > 0.0f ? g[i] : 0.0f;
}

// The same for bf16 storage: each element widened to f32, computed as the portable loop does, rounded to
// nearest even (to_bf16_flat: store_as's bits without a branch), so the bits are the portable loop's. The
// ReLUs select with masks: a select stayed a branch, unvectorised.
using bf16 = BFloat16;
[[gnu::always_inline]] inline float f32_of(bf16 v) { return bf16_to_f32(v); }
// f where keep, else +0.
[[gnu::always_inline]] inline float keep_or_zero(bool keep, float f) {
  return bits_f32(f32_bits(f) & (0u - static_cast<uint32_t>(keep)));
}
RT_MULTIVERSION void bf16_add(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16_flat(f32_of(a[i]) + f32_of(b[i]));
}
RT_MULTIVERSION void bf16_mul(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16_flat(f32_of(a[i]) * f32_of(b[i]));
}
RT_MULTIVERSION void bf16_relu(const bf16* x, bf16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = f32_of(x[i]);
    out[i] = to_bf16_flat(keep_or_zero(!(v <= 0.0f), v));
  }
}
RT_MULTIVERSION void bf16_relu_grad(const bf16* g, const bf16* x, bf16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16_flat(keep_or_zero(f32_of(x[i]) > 0.0f, f32_of(g[i])));
}
RT_MULTIVERSION void f32_to_bf16_n(const float* in, bf16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16_flat(in[i]);
}
RT_MULTIVERSION void bf16_to_f32_n(const bf16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_of(in[i]);
}

// ---------------------------------------------------------------------------------------------------
// unary

template <typename C, typename Fn>
void with_unary(UnaryOp op, Fn&& fn) {
  switch (op) {
    case UnaryOp::Neg:
      fn([](C x) { return static_cast<C>(-x); });
      return;
    case UnaryOp::Relu:
      fn([](C x) { return x <= C(0) ? C(0) : x; });  // NaN stays NaN
      return;
    case UnaryOp::Abs:
      fn([](C x) { return x < C(0) ? static_cast<C>(-x) : x; });
      return;
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

void unary(UnaryOp op, const Tensor& x, Tensor& out) {
  const int64_t n = x.numel();
  if (x.dtype() == DType::F32 && op == UnaryOp::Relu) {
    const float* in = x.data<float>();
    float* o = out.data<float>();
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) { f32_relu(in + b, o + b, e - b); });
    return;
  }
  if (x.dtype() == DType::BF16 && op == UnaryOp::Relu) {
    const bf16* in = x.data<bf16>();
    bf16* o = out.data<bf16>();
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) { bf16_relu(in + b, o + b, e - b); });
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

// ---------------------------------------------------------------------------------------------------
// binary with broadcasting

template <typename C, typename Fn>
void with_binary(BinaryOp op, Fn&& fn) {
  switch (op) {
    case BinaryOp::Add:
      fn([](C a, C b) { return static_cast<C>(a + b); });
      return;
    case BinaryOp::Sub:
      fn([](C a, C b) { return static_cast<C>(a - b); });
      return;
    case BinaryOp::Mul:
      fn([](C a, C b) { return static_cast<C>(a * b); });
      return;
    case BinaryOp::Div:
      fn([](C a, C b) {
        if constexpr (std::is_integral_v<C>) {
          if (b == 0) return C(0);  // integer division by zero is defined as 0 (no trap)
        }
        return static_cast<C>(a / b);
      });
      return;
    case BinaryOp::Maximum:
      fn([](C a, C b) { return (a >= b || a != a) ? a : b; });
      return;
    case BinaryOp::Minimum:
      fn([](C a, C b) { return (a <= b || a != a) ? a : b; });
      return;
    case BinaryOp::Eq:
      fn([](C a, C b) { return C(a == b); });
      return;
    case BinaryOp::Ne:
      fn([](C a, C b) { return C(a != b); });
      return;
    case BinaryOp::Lt:
      fn([](C a, C b) { return C(a < b); });
      return;
    case BinaryOp::Le:
      fn([](C a, C b) { return C(a <= b); });
      return;
    case BinaryOp::Gt:
      fn([](C a, C b) { return C(a > b); });
      return;
    case BinaryOp::Ge:
      fn([](C a, C b) { return C(a >= b); });
      return;
    case BinaryOp::ReluGrad:
      fn([](C g, C x) { return x > C(0) ? g : C(0); });
      return;
  }
}

// The same-shape Add, Mul and ReluGrad of one storage type through its compiled loops.
template <typename T>
using BinaryLoop = void (*)(const T*, const T*, T*, int64_t);
template <typename T>
void fast_binary(BinaryOp op, const T* pa, const T* pb, T* po, int64_t n, BinaryLoop<T> add, BinaryLoop<T> mul,
                 BinaryLoop<T> relu_grad) {
  const BinaryLoop<T> loop = op == BinaryOp::Add ? add : op == BinaryOp::Mul ? mul : relu_grad;
  parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) { loop(pa + lo, pb + lo, po + lo, hi - lo); });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, const BroadcastDesc& bc) {
  const int64_t n = out.numel();
  const bool same = a.numel() == n && b.numel() == n;
  const bool fast_op = op == BinaryOp::Add || op == BinaryOp::Mul || op == BinaryOp::ReluGrad;
  if (same && fast_op && a.dtype() == DType::F32 && out.dtype() == DType::F32)
    return fast_binary(op, a.data<float>(), b.data<float>(), out.data<float>(), n, f32_add, f32_mul, f32_relu_grad);
  if (same && fast_op && a.dtype() == DType::BF16 && out.dtype() == DType::BF16)
    return fast_binary(op, a.data<bf16>(), b.data<bf16>(), out.data<bf16>(), n, bf16_add, bf16_mul, bf16_relu_grad);
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
      if (out.dtype() == DType::U8)
        kernel(out.data<uint8_t>());
      else
        kernel(out.data<S>());
    });
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// fill / convert / scalar (also called by the GEMM: core/cpu/cpu_kernels.h)

void fill(Tensor& out, double value) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    const S v = store_as<S>(static_cast<compute_t<S>>(value));
    S* p = out.data<S>();
    parallel_for(out.numel(), kGrain, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, v); });
  });
}

void convert(const Tensor& src, Tensor& dst) {
  if (src.dtype() == DType::F32 && dst.dtype() == DType::BF16) {
    const float* in = src.data<float>();
    bf16* out = dst.data<bf16>();
    parallel_for(src.numel(), kGrain, [&](int64_t b, int64_t e) { f32_to_bf16_n(in + b, out + b, e - b); });
    return;
  }
  if (src.dtype() == DType::BF16 && dst.dtype() == DType::F32) {
    const bf16* in = src.data<bf16>();
    float* out = dst.data<float>();
    parallel_for(src.numel(), kGrain, [&](int64_t b, int64_t e) { bf16_to_f32_n(in + b, out + b, e - b); });
    return;
  }
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

void scalar(ScalarOp op, const Tensor& x, double s, Tensor& out) {
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
      case ScalarOp::Add:
        run([cs](C v) { return static_cast<C>(v + cs); });
        break;
      case ScalarOp::Mul:
        if constexpr (std::is_integral_v<C>)
          run([s](C v) { return static_cast<C>(static_cast<double>(v) * s); });
        else
          run([cs](C v) { return static_cast<C>(v * cs); });
        break;
      case ScalarOp::RSub:
        run([cs](C v) { return static_cast<C>(cs - v); });
        break;
      case ScalarOp::RDiv:
        if constexpr (std::is_integral_v<C>)
          RT_THROW("op 'rdiv' has no CPU kernel for integer dtypes");
        else
          run([cs](C v) { return cs / v; });
        break;
      case ScalarOp::Pow:
        if constexpr (std::is_integral_v<C>)
          RT_THROW("op 'pow' has no CPU kernel for integer dtypes");
        else
          run([cs](C v) { return std::pow(v, cs); });
        break;
    }
  });
}

void register_elementwise_kernels(KernelTable& t) {
  t.fill = &fill;
  t.convert = &convert;
  t.unary = &unary;
  t.binary = &binary;
  t.scalar = &scalar;
}

}  // namespace ringtrain::cpu
