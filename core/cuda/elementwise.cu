// core/cuda/elementwise.cu: the CUDA element-wise kernels: fill, convert, unary, binary (with
// broadcasting) and scalar ops, one grid-stride kernel each. Semantics match the CPU kernels
// (core/cpu/elementwise.cpp) entry by entry; all run on the calling thread's current stream.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/cuda/common.cuh"
#include "core/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "core/kernels.h"
#include "core/tensor.h"

namespace ringtrain::cuda {
namespace {

// Launch helpers, dtype dispatch and device math: core/cuda/common.cuh.
using namespace cuda_common;

// ---------------------------------------------------------------------------------------------------
// convert

// As the CPU: floating -> integer truncates toward zero through i64 (so u8 wraps); other pairs go through
// f64, except integer -> integer, which converts directly (through f64 an i64 above 2^53 would change).
template <typename D, typename S>
__device__ inline D convert_value(S v) {
  if constexpr (std::is_same_v<S, D>)
    return v;
  else if constexpr (std::is_integral_v<D> && std::is_integral_v<S>)
    return static_cast<D>(v);
  else if constexpr (std::is_integral_v<D>)
    return static_cast<D>(static_cast<int64_t>(load_as<double>(v)));
  else
    return store_as<D>(load_as<double>(v));
}

template <typename S, typename D>
__global__ void convert_kernel(const S* src /* (n) */, D* dst /* (n) */, int64_t n) {
  RT_GRID_STRIDE(i, n) dst[i] = convert_value<D>(src[i]);
}

void convert(const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  RT_CHECK(dst.numel() == n, "convert: ", src.describe(), " -> ", dst.describe(), " differ in size");
  if (n == 0) return;
  DeviceScope scope(dst);
  dispatch_all(src.dtype(), [&](auto src_tag) {
    using S = typename decltype(src_tag)::type;
    dispatch_all(dst.dtype(), [&](auto dst_tag) {
      using D = typename decltype(dst_tag)::type;
      convert_kernel<S, D><<<grid_for(n), kThreads, 0, stream_now()>>>(src.data<S>(), dst.data<D>(), n);
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// unary

template <typename C>
__device__ inline C unary_value(UnaryOp op, C v) {
  if constexpr (std::is_integral_v<C>) {
    switch (op) {
      case UnaryOp::Neg:
        return -v;
      case UnaryOp::Abs:
        return v < 0 ? -v : v;
      case UnaryOp::Relu:
        return v > 0 ? v : C(0);
      default:
        return C(0);  // rejected on the host
    }
  } else {
    switch (op) {
      case UnaryOp::Neg:
        return -v;
      case UnaryOp::Relu:
        return v <= C(0) ? C(0) : v;  // as the CPU: NaN stays NaN
      case UnaryOp::Exp:
        return dev_exp(v);
      case UnaryOp::Log:
        return dev_log(v);
      case UnaryOp::Sqrt:
        return dev_sqrt(v);
      case UnaryOp::Abs:
        return v < C(0) ? -v : v;  // as the CPU: -0 and NaN keep their sign bit
      case UnaryOp::Tanh:
        return dev_tanh(v);
      case UnaryOp::Sigmoid:
        return C(1) / (C(1) + dev_exp(-v));
    }
    return v;
  }
}

template <typename S>
__global__ void unary_kernel(UnaryOp op, const S* x /* (n) */, S* out /* (n) */, int64_t n) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, n) out[i] = store_as<S>(unary_value<C>(op, load_as<C>(x[i])));
}

// The vector path of a one-input op f (16-byte aligned x and out, which may alias): vector i holds
// elements [i * V, i * V + V); the last n % V go one per thread. f maps a stored element to a stored element.
template <typename S, typename F>
__global__ void map_vec_kernel(F f, const S* x /* (n) */, S* out /* (n) */, int64_t n) {
  constexpr int V = kVec<S>;
  const int64_t nvec = n / V;
  const auto* xv = reinterpret_cast<const Vec<S>*>(x);
  auto* ov = reinterpret_cast<Vec<S>*>(out);
  RT_GRID_STRIDE(i, nvec) {
    const Vec<S> a = xv[i];
    Vec<S> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = f(a.v[k]);
    ov[i] = r;
  }
  RT_GRID_STRIDE(j, n - nvec * V) out[nvec * V + j] = f(x[nvec * V + j]);
}

template <typename S>
struct UnaryFn {
  UnaryOp op;
  __device__ S operator()(S v) const {
    using C = compute_t<S>;
    return store_as<S>(unary_value<C>(op, load_as<C>(v)));
  }
};

// Blocks for a vector kernel over n elements: enough for the vectors or the tail, whichever is more.
template <typename S>
unsigned vec_grid(int64_t n) {
  const int64_t nvec = n / kVec<S>;
  return grid_for(std::max<int64_t>(nvec, n - nvec * kVec<S>));
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
      return "neg";
    case UnaryOp::Relu:
      return "relu";
    case UnaryOp::Exp:
      return "exp";
    case UnaryOp::Log:
      return "log";
    case UnaryOp::Sqrt:
      return "sqrt";
    case UnaryOp::Abs:
      return "abs";
    case UnaryOp::Tanh:
      return "tanh";
    case UnaryOp::Sigmoid:
      return "sigmoid";
  }
  return "unary";
}

void unary(UnaryOp op, const Tensor& x, Tensor& out) {
  const int64_t n = x.numel();
  const bool integer_ok = op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu;
  if (!is_floating(x.dtype()) && !integer_ok) raise_unsupported(unary_name(op), x.dtype());
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_all(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (all_aligned16(x.data<S>(), out.data<S>()))
      map_vec_kernel<S><<<vec_grid<S>(n), kThreads, 0, stream_now()>>>(UnaryFn<S>{op}, x.data<S>(), out.data<S>(), n);
    else
      unary_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(op, x.data<S>(), out.data<S>(), n);
  });
}

// ---------------------------------------------------------------------------------------------------
// binary (with broadcasting)

template <typename C>
__device__ inline C binary_value(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Add:
      return a + b;
    case BinaryOp::Sub:
      return a - b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Div:
      // Integer division by zero is undefined in C++ and traps on the CPU; define it as 0 here.
      if constexpr (std::is_integral_v<C>)
        return b == 0 ? C(0) : a / b;
      else
        return a / b;
    case BinaryOp::Maximum:
      return nan_max(a, b);
    case BinaryOp::Minimum:
      return nan_min(a, b);
    case BinaryOp::Eq:
      return C(a == b);
    case BinaryOp::Ne:
      return C(a != b);
    case BinaryOp::Lt:
      return C(a < b);
    case BinaryOp::Le:
      return C(a <= b);
    case BinaryOp::Gt:
      return C(a > b);
    case BinaryOp::Ge:
      return C(a >= b);
    case BinaryOp::ReluGrad:
      return b > C(0) ? a : C(0);  // as the CPU: masked entries are 0 even if a is inf/NaN
  }
  return C(0);
}

// How each input maps out index i to its own index. `tail` inputs repeat along the leading dims only
// (same shape, scalar, bias over the last dims): index i % numel. Anything else decomposes i over
// out_dims and dots with the input's strides.
struct BinaryIndexing {
  bool general = false;
  int64_t a_numel = 0, b_numel = 0;
  BroadcastDesc bc;
};

bool broadcasts_as_tail(const BroadcastDesc& bc, const int64_t* stride, int64_t in_numel) {
  int64_t running = 1;
  for (int d = bc.ndim - 1; d >= 0; --d) {
    const int64_t size = bc.out_dims[d];
    if (size == 1) continue;  // the stride along a size-1 dim is never used
    if (running < in_numel) {
      if (stride[d] != running) return false;
      running *= size;
    } else if (stride[d] != 0) {
      return false;
    }
  }
  return running == in_numel;
}

template <typename S, typename O>
__global__ void binary_kernel(BinaryOp op, const S* a, const S* b, O* out /* (n), may alias a */, int64_t n,
                              BinaryIndexing ix) {
  using C = compute_t<S>;
  RT_GRID_STRIDE(i, n) {
    int64_t ai, bi;
    if (ix.general) {
      ai = 0;
      bi = 0;
      int64_t rest = i;
      for (int d = ix.bc.ndim - 1; d >= 0; --d) {
        const int64_t coord = rest % ix.bc.out_dims[d];
        rest /= ix.bc.out_dims[d];
        ai += coord * ix.bc.a_stride[d];
        bi += coord * ix.bc.b_stride[d];
      }
    } else {
      ai = ix.a_numel == n ? i : i % ix.a_numel;
      bi = ix.b_numel == n ? i : i % ix.b_numel;
    }
    out[i] = store_as<O>(binary_value<C>(op, load_as<C>(a[ai]), load_as<C>(b[bi])));
  }
}

// The vector path of a, b and out all of n elements (16-byte aligned; out may alias a or b).
template <typename S>
__global__ void binary_vec_kernel(BinaryOp op, const S* a, const S* b, S* out /* (n) */, int64_t n) {
  using C = compute_t<S>;
  constexpr int V = kVec<S>;
  const int64_t nvec = n / V;
  const auto* av = reinterpret_cast<const Vec<S>*>(a);
  const auto* bv = reinterpret_cast<const Vec<S>*>(b);
  auto* ov = reinterpret_cast<Vec<S>*>(out);
  RT_GRID_STRIDE(i, nvec) {
    const Vec<S> x = av[i], y = bv[i];
    Vec<S> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = store_as<S>(binary_value<C>(op, load_as<C>(x.v[k]), load_as<C>(y.v[k])));
    ov[i] = r;
  }
  RT_GRID_STRIDE(j, n - nvec * V) {
    const int64_t i = nvec * V + j;
    out[i] = store_as<S>(binary_value<C>(op, load_as<C>(a[i]), load_as<C>(b[i])));
  }
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, const BroadcastDesc& bc) {
  const int64_t n = out.numel();
  if (op == BinaryOp::ReluGrad && !is_floating(a.dtype())) raise_unsupported("relu_backward", a.dtype());
  RT_CHECK(a.dtype() == b.dtype(), "binary: dtypes differ: ", a.describe(), " and ", b.describe());
  if (n == 0) return;
  BinaryIndexing ix;
  ix.a_numel = a.numel();
  ix.b_numel = b.numel();
  ix.bc = bc;
  ix.general = !broadcasts_as_tail(bc, bc.a_stride, ix.a_numel) || !broadcasts_as_tail(bc, bc.b_stride, ix.b_numel);
  DeviceScope scope(out);
  dispatch_all(a.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (is_comparison(op)) {
      RT_CHECK(out.dtype() == DType::U8, "comparison output must be u8, got ", out.describe());
      binary_kernel<S, uint8_t>
          <<<grid_for(n), kThreads, 0, stream_now()>>>(op, a.data<S>(), b.data<S>(), out.data<uint8_t>(), n, ix);
    } else if (!ix.general && ix.a_numel == n && ix.b_numel == n &&
               all_aligned16(a.data<S>(), b.data<S>(), out.data<S>())) {
      binary_vec_kernel<S>
          <<<vec_grid<S>(n), kThreads, 0, stream_now()>>>(op, a.data<S>(), b.data<S>(), out.data<S>(), n);
    } else {
      binary_kernel<S, S>
          <<<grid_for(n), kThreads, 0, stream_now()>>>(op, a.data<S>(), b.data<S>(), out.data<S>(), n, ix);
    }
  });
}

// ---------------------------------------------------------------------------------------------------
// scalar

// As the CPU: s is converted to the compute type (integers: truncated to i64), except that integer Mul
// scales in f64 (so `x * 0.5` halves) and truncates back through i64.
template <typename C>
__device__ inline C scalar_value(ScalarOp op, C v, double s, C sv) {
  C r = v;
  if constexpr (std::is_integral_v<C>) {
    switch (op) {
      case ScalarOp::Add:
        r = v + sv;
        break;
      case ScalarOp::Mul:
        r = static_cast<C>(static_cast<double>(v) * s);
        break;
      case ScalarOp::RSub:
        r = sv - v;
        break;
      default:
        break;  // RDiv / Pow: rejected on the host
    }
  } else {
    switch (op) {
      case ScalarOp::Add:
        r = v + sv;
        break;
      case ScalarOp::Mul:
        r = v * sv;
        break;
      case ScalarOp::RSub:
        r = sv - v;
        break;
      case ScalarOp::RDiv:
        r = sv / v;
        break;
      case ScalarOp::Pow:
        r = dev_pow(v, sv);
        break;
    }
  }
  return r;
}

template <typename S>
__global__ void scalar_kernel(ScalarOp op, const S* x /* (n) */, double s, S* out /* (n), may alias x */, int64_t n) {
  using C = compute_t<S>;
  const C sv = static_cast<C>(s);
  RT_GRID_STRIDE(i, n) out[i] = store_as<S>(scalar_value<C>(op, load_as<C>(x[i]), s, sv));
}

template <typename S>
struct ScalarFn {
  ScalarOp op;
  double s;
  compute_t<S> sv;  // s in the compute type, as scalar_kernel converts it
  __device__ S operator()(S v) const {
    return store_as<S>(scalar_value<compute_t<S>>(op, load_as<compute_t<S>>(v), s, sv));
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------
// fill, scalar (also called by the reduction and the GEMM: core/cuda/cuda_kernels.h)

void fill(Tensor& out, double value) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_all(out.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    // Converted once on the host exactly as the CPU does (through the compute type, so integers wrap).
    const S v = store_as<S>(static_cast<compute_t<S>>(value));
    fill_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(out.data<S>(), v, n);
  });
}

void scalar(ScalarOp op, const Tensor& x, double s, Tensor& out) {
  const int64_t n = x.numel();
  if (op == ScalarOp::RDiv && !is_floating(x.dtype())) raise_unsupported("rdiv", x.dtype());
  if (op == ScalarOp::Pow && !is_floating(x.dtype())) raise_unsupported("pow", x.dtype());
  if (n == 0) return;
  DeviceScope scope(out);
  dispatch_all(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (all_aligned16(x.data<S>(), out.data<S>()))
      map_vec_kernel<S><<<vec_grid<S>(n), kThreads, 0, stream_now()>>>(ScalarFn<S>{op, s, static_cast<compute_t<S>>(s)},
                                                                       x.data<S>(), out.data<S>(), n);
    else
      scalar_kernel<S><<<grid_for(n), kThreads, 0, stream_now()>>>(op, x.data<S>(), s, out.data<S>(), n);
  });
}

void register_elementwise_kernels(KernelTable& t) {
  t.fill = &fill;
  t.convert = &convert;
  t.unary = &unary;
  t.binary = &binary;
  t.scalar = &scalar;
}

}  // namespace ringtrain::cuda
