// core/ops.cpp: op dispatch, input checks and each op's backward, written next to its forward.
#include "core/ops.h"

#include <algorithm>
#include <cmath>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/dispatch.h"
#include "core/ops_internal.h"

namespace ringtrain {

// ---------------------------------------------------------------------------------------------------
// Dispatch

namespace detail {

const KernelTable& kernel_table(Device device, const char* op) {
  if (device.is_cpu()) return cpu_kernels();
  const KernelTable* table = cuda_kernels();
  if (!table) {
    RT_THROW("op '", op, "' has no kernels for device ", device.str(),
             ": ringtrain was built without CUDA (RINGTRAIN_CUDA=OFF or CUDA not found at configure time)");
  }
  return *table;
}

void after_op(Device device, const char* op) {
  if (device.is_cpu()) return;
  if (auto hook = kernel_table(device, op).after_op) hook(op);
}

Shape broadcast_shapes(const char* op, const Tensor& a, const Tensor& b) {
  return broadcast_shapes(op, a.shape(), b.shape());
}

Shape broadcast_shapes(const char* op, const Shape& sa, const Shape& sb) {
  const int ndim = std::max(sa.ndim(), sb.ndim());
  std::vector<int64_t> dims(static_cast<size_t>(ndim));
  for (int d = 0; d < ndim; ++d) {
    int da = d - (ndim - sa.ndim()), db = d - (ndim - sb.ndim());
    int64_t x = da >= 0 ? sa[da] : 1, y = db >= 0 ? sb[db] : 1;
    if (x != y && x != 1 && y != 1)
      RT_THROW("op '", op, "': shapes ", sa, " and ", sb, " do not broadcast (dim ", d, ": ", x, " vs ", y, ")");
    dims[static_cast<size_t>(d)] = x == 1 ? y : x;
  }
  return Shape(std::span<const int64_t>(dims));
}

void check_same_device_dtype(const char* op, const Tensor& a, const Tensor& b) {
  RT_CHECK(a.defined() && b.defined(), "op '", op, "': undefined input");
  if (a.device() != b.device())
    RT_THROW("op '", op, "': inputs are on different devices: ", a.describe(), " and ", b.describe());
  if (a.dtype() != b.dtype())
    RT_THROW("op '", op, "': dtype mismatch: ", a.describe(), " and ", b.describe(), " (convert one with .to(dtype))");
}

void check_floating(const char* op, const Tensor& x) {
  RT_CHECK(x.defined(), "op '", op, "': undefined input");
  if (!is_floating(x.dtype())) RT_THROW("op '", op, "' needs a floating-point tensor, got ", x.describe());
}

// Autocast (core/autocast.h): conv2d, linear and matmul whose inputs are f32 or already the autocast
// dtype (activations from an earlier autocast op meeting f32 weights) run in the autocast dtype; f64 never.
std::optional<DType> autocast_for(const Tensor& a, const Tensor& b) {
  const auto dtype = autocast_dtype();
  if (!dtype) return std::nullopt;
  auto eligible = [&](DType t) { return t == DType::F32 || t == *dtype; };
  if (!eligible(a.dtype()) || !eligible(b.dtype()) || (a.dtype() == *dtype && b.dtype() == *dtype)) return std::nullopt;
  return dtype;
}
Tensor cast_if_defined(const Tensor& t, DType dtype) { return t.defined() ? autocast_cast(t, dtype) : t; }
}  // namespace detail

using detail::autocast_for;
using detail::broadcast_shapes;
using detail::cast_if_defined;
using detail::check_floating;
using detail::check_same_device_dtype;

BroadcastDesc make_broadcast(const Shape& a, const Shape& b, const Shape& out) {
  BroadcastDesc bc;
  bc.ndim = out.ndim();
  auto strides_for = [&](const Shape& in, int64_t* stride) {
    int64_t running = 1;
    for (int d = out.ndim() - 1; d >= 0; --d) {
      int in_dim = d - (out.ndim() - in.ndim());
      if (in_dim < 0) {
        stride[d] = 0;
        continue;
      }
      stride[d] = in[in_dim] == 1 && out[d] != 1 ? 0 : running;
      running *= in[in_dim];
    }
  };
  for (int d = 0; d < out.ndim(); ++d) bc.out_dims[d] = out[d];
  strides_for(a, bc.a_stride);
  strides_for(b, bc.b_stride);
  return bc;
}

namespace {

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return "add";
    case BinaryOp::Sub:
      return "sub";
    case BinaryOp::Mul:
      return "mul";
    case BinaryOp::Div:
      return "div";
    case BinaryOp::Maximum:
      return "maximum";
    case BinaryOp::Minimum:
      return "minimum";
    case BinaryOp::Eq:
      return "eq";
    case BinaryOp::Ne:
      return "ne";
    case BinaryOp::Lt:
      return "lt";
    case BinaryOp::Le:
      return "le";
    case BinaryOp::Gt:
      return "gt";
    case BinaryOp::Ge:
      return "ge";
    case BinaryOp::ReluGrad:
      return "relu_backward";
  }
  return "binary";
}

Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_same_device_dtype(name, a, b);
  Shape out_shape = broadcast_shapes(name, a, b);
  Tensor out = Tensor::empty(out_shape, is_comparison(op) ? DType::U8 : a.dtype(), a.device());
  RT_KERNEL(a.device(), name, binary)(op, a, b, out, make_broadcast(a.shape(), b.shape(), out_shape));
  detail::after_op(a.device(), name);
  return out;
}

Tensor unary_forward(UnaryOp op, const char* name, const Tensor& x) {
  RT_CHECK(x.defined(), "op '", name, "': undefined input");
  if (op != UnaryOp::Neg && op != UnaryOp::Abs && op != UnaryOp::Relu) check_floating(name, x);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  RT_KERNEL(x.device(), name, unary)(op, x, out);
  detail::after_op(x.device(), name);
  return out;
}

Tensor scalar_forward(ScalarOp op, const char* name, const Tensor& x, double s) {
  RT_CHECK(x.defined(), "op '", name, "': undefined input");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  RT_KERNEL(x.device(), name, scalar)(op, x, s, out);
  detail::after_op(x.device(), name);
  return out;
}

using Grads = std::vector<Tensor>;

}  // namespace

// The process-wide generator and TF32 switch: core/process_state.cpp.

// ---------------------------------------------------------------------------------------------------
// Reductions (first: backward of broadcasting ops needs sum_to)

namespace {
Tensor reduce_forward(ReduceOp op, const char* name, const Tensor& x, int dim, bool keepdim, Tensor* argmax) {
  RT_CHECK(x.defined(), "op '", name, "': undefined input");
  const Shape& s = x.shape();
  int64_t outer = 1, n = 1, inner = 1;
  std::vector<int64_t> out_dims;
  if (dim == INT32_MIN) {  // all elements
    n = s.numel();
  } else {
    int d = s.wrap_dim(dim, name);
    for (int i = 0; i < d; ++i) outer *= s[i];
    n = s[d];
    for (int i = d + 1; i < s.ndim(); ++i) inner *= s[i];
    for (int i = 0; i < s.ndim(); ++i) {
      if (i != d)
        out_dims.push_back(s[i]);
      else if (keepdim)
        out_dims.push_back(1);
    }
  }
  if (op == ReduceOp::Max && n == 0) RT_THROW("op '", name, "' of an empty dimension of ", x.describe());
  Shape out_shape{std::span<const int64_t>(out_dims)};
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (argmax) *argmax = Tensor::empty(out_shape, DType::I64, x.device());
  RT_KERNEL(x.device(), name, reduce)(op, x, outer, n, inner, out, argmax);
  detail::after_op(x.device(), name);
  return out;
}

constexpr int kAllDims = INT32_MIN;

// Expands a reduced gradient back over the reduced dim: g has the reduced shape (keepdim or not).
Tensor expand_reduced(const Tensor& g, const Shape& input_shape, int dim) {
  if (dim == kAllDims) return mul(Tensor::ones(input_shape, g.dtype(), g.device()), g.reshape(Shape{}));
  std::vector<int64_t> keep(input_shape.begin(), input_shape.end());
  keep[static_cast<size_t>(dim)] = 1;
  return mul(Tensor::ones(input_shape, g.dtype(), g.device()), g.reshape(Shape(std::span<const int64_t>(keep))));
}

Tensor sum_impl(const Tensor& x, int dim, bool keepdim) {
  Tensor out = reduce_forward(ReduceOp::Sum, "sum", x, dim, keepdim, nullptr);
  if (!needs_grad({&x})) return out;
  Shape input_shape = x.shape();
  int wrapped = dim == kAllDims ? kAllDims : input_shape.wrap_dim(dim, "sum");
  return record("sum", {&x}, out,
                [input_shape, wrapped](const Tensor& g) { return Grads{expand_reduced(g, input_shape, wrapped)}; });
}

Tensor max_impl(const Tensor& x, int dim, bool keepdim) {
  Tensor argmax;
  Tensor out = reduce_forward(ReduceOp::Max, "max", x, dim, keepdim, &argmax);
  if (!needs_grad({&x})) return out;
  Shape input_shape = x.shape();
  int wrapped = dim == kAllDims ? kAllDims : input_shape.wrap_dim(dim, "max");
  return record("max", {&x}, out, [input_shape, wrapped, argmax](const Tensor& g) {
    // Gradient flows to the first maximum only: one-hot of argmax along the reduced dim.
    const Shape& s = input_shape;
    int64_t outer = 1, n = s.numel(), inner = 1;
    if (wrapped != kAllDims) {
      n = s[wrapped];
      for (int i = 0; i < wrapped; ++i) outer *= s[i];
      for (int i = wrapped + 1; i < s.ndim(); ++i) inner *= s[i];
    }
    // positions: (outer, n, inner) index along n; compare with argmax (outer, 1, inner).
    std::vector<double> iota(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) iota[static_cast<size_t>(i)] = static_cast<double>(i);
    Tensor positions = Tensor::from_vector(iota, Shape{1, n, 1}, DType::I64, g.device());
    Tensor hit = eq(positions, argmax.reshape(Shape{outer, 1, inner})).to(g.dtype());
    Tensor grad = mul(hit, g.reshape(Shape{outer, 1, inner}));
    return Grads{grad.reshape(input_shape)};
  });
}
}  // namespace

Tensor sum(const Tensor& x) { return sum_impl(x, kAllDims, false); }
Tensor sum(const Tensor& x, int dim, bool keepdim) { return sum_impl(x, dim, keepdim); }

Tensor mean(const Tensor& x) {
  check_floating("mean", x);
  return mul(sum(x), 1.0 / static_cast<double>(std::max<int64_t>(1, x.numel())));
}
Tensor mean(const Tensor& x, int dim, bool keepdim) {
  check_floating("mean", x);
  int64_t n = x.size(dim);
  return mul(sum(x, dim, keepdim), 1.0 / static_cast<double>(std::max<int64_t>(1, n)));
}

Tensor max(const Tensor& x) { return max_impl(x, kAllDims, false); }
Tensor max(const Tensor& x, int dim, bool keepdim) { return max_impl(x, dim, keepdim); }

Tensor argmax(const Tensor& x, int dim, bool keepdim) {
  Tensor indices;
  reduce_forward(ReduceOp::Max, "argmax", x, dim, keepdim, &indices);
  return indices;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int extra = x.ndim() - shape.ndim();
  RT_CHECK(extra >= 0, "sum_to: cannot reduce ", x.describe(), " to the larger shape ", shape);
  Tensor out = x;
  // Sum the leading dims that the target does not have, then the dims broadcast from 1.
  for (int i = 0; i < extra; ++i) out = sum(out, 0, false);
  for (int d = 0; d < shape.ndim(); ++d) {
    if (shape[d] == 1 && out.shape()[d] != 1) out = sum(out, d, true);
  }
  RT_CHECK(out.shape() == shape, "sum_to: ", x.describe(), " does not broadcast to ", shape);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Elementwise binary

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Add, a, b);
  if (!needs_grad({&a, &b})) return out;
  Shape sa = a.shape(), sb = b.shape();
  return record("add", {&a, &b}, out, [sa, sb](const Tensor& g) { return Grads{sum_to(g, sa), sum_to(g, sb)}; });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Sub, a, b);
  if (!needs_grad({&a, &b})) return out;
  Shape sa = a.shape(), sb = b.shape();
  return record("sub", {&a, &b}, out, [sa, sb](const Tensor& g) { return Grads{sum_to(g, sa), sum_to(neg(g), sb)}; });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Mul, a, b);
  if (!needs_grad({&a, &b})) return out;
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  Tensor sa = a.detach(), sb = b.detach();
  return record("mul", {&a, &b}, out, [sa, sb, need_a, need_b](const Tensor& g) {
    return Grads{need_a ? sum_to(mul(g, sb), sa.shape()) : Tensor(),
                 need_b ? sum_to(mul(g, sa), sb.shape()) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Div, a, b);
  if (!needs_grad({&a, &b})) return out;
  bool need_b = b.requires_grad();
  Tensor sb = b.detach(), so = out.detach();
  Shape sa = a.shape();
  return record("div", {&a, &b}, out, [sa, sb, so, need_b](const Tensor& g) {
    Tensor ga = div(g, sb);
    // d(a/b)/db = -(a/b)/b
    return Grads{sum_to(ga, sa), need_b ? sum_to(neg(mul(ga, so)), sb.shape()) : Tensor()};
  });
}

namespace {
Tensor min_max_binary(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(op, a, b);
  if (!needs_grad({&a, &b})) return out;
  Tensor sa = a.detach(), sb = b.detach();
  return record(name, {&a, &b}, out, [sa, sb, op](const Tensor& g) {
    // Ties send the gradient to a.
    Tensor pick_a = (op == BinaryOp::Maximum ? ge(sa, sb) : le(sa, sb)).to(g.dtype());
    Tensor ga = mul(g, pick_a);
    Tensor gb = sub(g, ga);
    return Grads{sum_to(ga, sa.shape()), sum_to(gb, sb.shape())};
  });
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return min_max_binary(BinaryOp::Maximum, "maximum", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return min_max_binary(BinaryOp::Minimum, "minimum", a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Ge, a, b); }

// ---------------------------------------------------------------------------------------------------
// Scalar

Tensor add(const Tensor& a, double s) {
  Tensor out = scalar_forward(ScalarOp::Add, "add_scalar", a, s);
  if (!needs_grad({&a})) return out;
  return record("add_scalar", {&a}, out, [](const Tensor& g) { return Grads{g}; });
}

Tensor mul(const Tensor& a, double s) {
  Tensor out = scalar_forward(ScalarOp::Mul, "mul_scalar", a, s);
  if (!needs_grad({&a})) return out;
  return record("mul_scalar", {&a}, out, [s](const Tensor& g) { return Grads{mul(g, s)}; });
}

Tensor rsub(const Tensor& a, double s) {
  Tensor out = scalar_forward(ScalarOp::RSub, "rsub", a, s);
  if (!needs_grad({&a})) return out;
  return record("rsub", {&a}, out, [](const Tensor& g) { return Grads{neg(g)}; });
}

Tensor rdiv(const Tensor& a, double s) {
  Tensor out = scalar_forward(ScalarOp::RDiv, "rdiv", a, s);
  if (!needs_grad({&a})) return out;
  Tensor sa = a.detach(), so = out.detach();
  // d(s/a)/da = -(s/a)/a
  return record("rdiv", {&a}, out, [sa, so](const Tensor& g) { return Grads{neg(div(mul(g, so), sa))}; });
}

Tensor pow(const Tensor& a, double exponent) {
  check_floating("pow", a);
  Tensor out = scalar_forward(ScalarOp::Pow, "pow", a, exponent);
  if (!needs_grad({&a})) return out;
  Tensor sa = a.detach();
  return record("pow", {&a}, out,
                [sa, exponent](const Tensor& g) { return Grads{mul(mul(g, pow(sa, exponent - 1.0)), exponent)}; });
}

// ---------------------------------------------------------------------------------------------------
// Unary

Tensor neg(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Neg, "neg", x);
  if (!needs_grad({&x})) return out;
  return record("neg", {&x}, out, [](const Tensor& g) { return Grads{neg(g)}; });
}

Tensor relu(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Relu, "relu", x);
  if (!needs_grad({&x})) return out;
  Tensor sx = x.detach();
  return record("relu", {&x}, out, [sx](const Tensor& g) {
    Tensor dx = Tensor::empty(g.shape(), g.dtype(), g.device());
    RT_KERNEL(g.device(), "relu_backward", binary)
    (BinaryOp::ReluGrad, g, sx, dx, make_broadcast(g.shape(), sx.shape(), g.shape()));
    detail::after_op(g.device(), "relu_backward");
    return Grads{dx};
  });
}

Tensor exp(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Exp, "exp", x);
  if (!needs_grad({&x})) return out;
  Tensor so = out.detach();
  return record("exp", {&x}, out, [so](const Tensor& g) { return Grads{mul(g, so)}; });
}

Tensor log(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Log, "log", x);
  if (!needs_grad({&x})) return out;
  Tensor sx = x.detach();
  return record("log", {&x}, out, [sx](const Tensor& g) { return Grads{div(g, sx)}; });
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Sqrt, "sqrt", x);
  if (!needs_grad({&x})) return out;
  Tensor so = out.detach();
  return record("sqrt", {&x}, out, [so](const Tensor& g) { return Grads{mul(div(g, so), 0.5)}; });
}

Tensor abs(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Abs, "abs", x);
  if (!needs_grad({&x})) return out;
  Tensor sx = x.detach();
  return record("abs", {&x}, out, [sx](const Tensor& g) {
    Tensor zero = Tensor::zeros(Shape{}, sx.dtype(), sx.device());
    Tensor sign = sub(gt(sx, zero).to(sx.dtype()), lt(sx, zero).to(sx.dtype()));
    return Grads{mul(g, sign)};
  });
}

Tensor tanh(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Tanh, "tanh", x);
  if (!needs_grad({&x})) return out;
  Tensor so = out.detach();
  return record("tanh", {&x}, out, [so](const Tensor& g) { return Grads{mul(g, rsub(mul(so, so), 1.0))}; });
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Sigmoid, "sigmoid", x);
  if (!needs_grad({&x})) return out;
  Tensor so = out.detach();
  return record("sigmoid", {&x}, out, [so](const Tensor& g) { return Grads{mul(g, mul(so, rsub(so, 1.0)))}; });
}

// ---------------------------------------------------------------------------------------------------
// Linear algebra

namespace {
// C = op(A) op(B) with shapes already validated; a: (batch_a, m, k) or (m, k) etc.
void gemm_into(const Tensor& a, const Tensor& b, Tensor& c, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
               int64_t batch, int64_t stride_a, int64_t stride_b, double beta = 0.0) {
  GemmArgs args;
  args.trans_a = ta;
  args.trans_b = tb;
  args.m = m;
  args.n = n;
  args.k = k;
  args.beta = beta;
  args.lda = ta ? m : k;
  args.ldb = tb ? k : n;
  args.ldc = n;
  args.allow_tf32 = allow_tf32();
  RT_KERNEL(a.device(), "matmul", gemm)(args, a, b, c, batch, stride_a, stride_b, m * n);
  detail::after_op(a.device(), "matmul");
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto dtype = autocast_for(a, b)) return matmul(autocast_cast(a, *dtype), autocast_cast(b, *dtype));
  check_same_device_dtype("matmul", a, b);
  check_floating("matmul", a);
  if (a.ndim() < 2 || (b.ndim() != 2 && b.ndim() != 3))
    RT_THROW("op 'matmul': expected a (..., M, K) and b (K, N) or (B, K, N), got ", a.describe(), " and ",
             b.describe());
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (b.size(-2) != k)
    RT_THROW("op 'matmul': inner dimensions differ: ", a.describe(), " x ", b.describe(), " (", k, " vs ", b.size(-2),
             ")");
  const bool batched_b = b.ndim() == 3;
  int64_t batch = 1;  // product of a's leading dims (not numel / (m k), which breaks for k == 0)
  for (int d = 0; d < a.ndim() - 2; ++d) batch *= a.size(d);
  if (batched_b && (a.ndim() != 3 || a.size(0) != b.size(0)))
    RT_THROW("op 'matmul': batched b ", b.describe(), " needs a of shape (", b.size(0), ", M, K), got ", a.describe());
  std::vector<int64_t> out_dims(a.shape().begin(), a.shape().end());
  out_dims.back() = n;
  Tensor out = Tensor::empty(Shape(std::span<const int64_t>(out_dims)), a.dtype(), a.device());
  if (batched_b) {
    gemm_into(a, b, out, false, false, m, n, k, batch, m * k, k * n);
  } else {
    // Leading dims of a fold into M: one GEMM (batch*m, k) x (k, n).
    gemm_into(a, b, out, false, false, batch * m, n, k, 1, 0, 0);
  }
  if (!needs_grad({&a, &b})) return out;
  Tensor sa = a.detach(), sb = b.detach();
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  return record("matmul", {&a, &b}, out, [sa, sb, m, n, k, batch, batched_b, need_a, need_b](const Tensor& g) {
    Tensor ga, gb;
    if (need_a) {  // dA = dC B^T
      ga = Tensor::empty(sa.shape(), g.dtype(), g.device());
      if (batched_b)
        gemm_into(g, sb, ga, false, true, m, k, n, batch, m * n, k * n);
      else
        gemm_into(g, sb, ga, false, true, batch * m, k, n, 1, 0, 0);
    }
    if (need_b) {  // dB = A^T dC
      gb = Tensor::empty(sb.shape(), g.dtype(), g.device());
      if (batched_b)
        gemm_into(sa, g, gb, true, false, k, n, m, batch, m * k, m * n);
      else
        gemm_into(sa, g, gb, true, false, k, n, batch * m, 1, 0, 0);
    }
    return Grads{ga, gb};
  });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (auto dtype = autocast_for(x, weight))
    return linear(autocast_cast(x, *dtype), autocast_cast(weight, *dtype), cast_if_defined(bias, *dtype));
  check_same_device_dtype("linear", x, weight);
  if (weight.ndim() != 2 || x.ndim() < 1 || x.size(-1) != weight.size(1))
    RT_THROW("op 'linear': input ", x.describe(), " and weight ", weight.describe(),
             " do not fit (expected weight (out, in) with in == input's last dim)");
  if (bias.defined()) {
    check_same_device_dtype("linear", x, bias);
    if (bias.ndim() != 1 || bias.size(0) != weight.size(0))
      RT_THROW("op 'linear': bias ", bias.describe(), " does not match weight ", weight.describe());
  }
  check_floating("linear", x);
  const int64_t in = weight.size(1), out_features = weight.size(0);
  int64_t rows = 1;  // product of x's leading dims (correct for in == 0 too)
  for (int d = 0; d < x.ndim() - 1; ++d) rows *= x.size(d);
  std::vector<int64_t> out_dims(x.shape().begin(), x.shape().end());
  out_dims.back() = out_features;
  Tensor out = Tensor::empty(Shape(std::span<const int64_t>(out_dims)), x.dtype(), x.device());
  // out (rows, out) = x (rows, in) W^T; bias is added by broadcasting.
  gemm_into(x, weight, out, false, true, rows, out_features, in, 1, 0, 0);
  if (bias.defined()) {
    BroadcastDesc bc = make_broadcast(out.shape(), bias.shape(), out.shape());
    RT_KERNEL(x.device(), "linear", binary)(BinaryOp::Add, out, bias, out, bc);
    detail::after_op(x.device(), "linear");
  }
  if (!needs_grad({&x, &weight, &bias})) return out;
  Tensor sx = x.detach(), sw = weight.detach();
  bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  bool need_b = bias.defined() && bias.requires_grad();
  return record("linear", {&x, &weight, &bias}, out,
                [sx, sw, rows, in, out_features, need_x, need_w, need_b](const Tensor& g) {
                  Tensor gx, gw, gb;
                  if (need_x) {  // dX (rows, in) = dY (rows, out) W (out, in)
                    gx = Tensor::empty(sx.shape(), g.dtype(), g.device());
                    gemm_into(g, sw, gx, false, false, rows, in, out_features, 1, 0, 0);
                  }
                  if (need_w) {  // dW (out, in) = dY^T (out, rows) X (rows, in)
                    gw = Tensor::empty(sw.shape(), g.dtype(), g.device());
                    gemm_into(g, sx, gw, true, false, out_features, in, rows, 1, 0, 0);
                  }
                  if (need_b) gb = sum(g.reshape(Shape{rows, out_features}), 0, false);
                  return Grads{gx, gw, gb};
                });
}

// ---------------------------------------------------------------------------------------------------
// Convolution

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) {
  if (auto dtype = autocast_for(x, weight))
    return conv2d(autocast_cast(x, *dtype), autocast_cast(weight, *dtype), cast_if_defined(bias, *dtype), params);
  check_same_device_dtype("conv2d", x, weight);
  check_floating("conv2d", x);
  const auto& pr = params;
  if (pr.stride_h < 1 || pr.stride_w < 1 || pr.dilation_h < 1 || pr.dilation_w < 1 || pr.pad_h < 0 || pr.pad_w < 0 ||
      pr.groups < 1)
    RT_THROW("op 'conv2d': stride (", pr.stride_h, ", ", pr.stride_w, ") and dilation (", pr.dilation_h, ", ",
             pr.dilation_w, ") must be >= 1, padding (", pr.pad_h, ", ", pr.pad_w, ") >= 0, groups (", pr.groups,
             ") >= 1");
  if (x.ndim() != 4 || weight.ndim() != 4)
    RT_THROW("op 'conv2d': expected input (N, H, W, C) and weight (K, R, S, C/groups), got ", x.describe(), " and ",
             weight.describe());
  ConvGeometry g;
  g.n = x.size(0);
  g.h = x.size(1);
  g.w = x.size(2);
  g.c = x.size(3);
  g.k = weight.size(0);
  g.r = weight.size(1);
  g.s = weight.size(2);
  g.stride_h = pr.stride_h;
  g.stride_w = pr.stride_w;
  g.pad_h = pr.pad_h;
  g.pad_w = pr.pad_w;
  g.dilation_h = pr.dilation_h;
  g.dilation_w = pr.dilation_w;
  g.groups = pr.groups;
  if (g.c % g.groups != 0 || g.k % g.groups != 0 || weight.size(3) != g.c / g.groups)
    RT_THROW("op 'conv2d': input ", x.describe(), " with ", g.groups, " group(s) needs weight (K, R, S, ",
             g.c / std::max<int64_t>(1, g.groups), ") with K divisible by the groups, got ", weight.describe());
  if (bias.defined()) {
    check_same_device_dtype("conv2d", x, bias);
    if (bias.ndim() != 1 || bias.size(0) != g.k)
      RT_THROW("op 'conv2d': bias ", bias.describe(), " does not match ", g.k, " output channels");
  }
  g.p = (g.h + 2 * g.pad_h - g.dilation_h * (g.r - 1) - 1) / g.stride_h + 1;
  g.q = (g.w + 2 * g.pad_w - g.dilation_w * (g.s - 1) - 1) / g.stride_w + 1;
  if (g.p <= 0 || g.q <= 0)
    RT_THROW("op 'conv2d': input ", x.describe(), " is smaller than the ", g.r, "x", g.s, " filter (dilation ",
             g.dilation_h, ", padding ", g.pad_h, ")");
  Tensor y = Tensor::empty(Shape{g.n, g.p, g.q, g.k}, x.dtype(), x.device());
  const Tensor* bias_ptr = bias.defined() ? &bias : nullptr;
  RT_KERNEL(x.device(), "conv2d", conv2d_forward)(x, weight, bias_ptr, g, y);
  detail::after_op(x.device(), "conv2d");
  if (!needs_grad({&x, &weight, &bias})) return y;
  Tensor sx = x.detach(), sw = weight.detach();
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  return record("conv2d", {&x, &weight, &bias}, y, [sx, sw, g, need_x, need_w, need_b](const Tensor& dy) {
    Tensor dx, dw, db;
    if (need_x) {
      dx = Tensor::empty(sx.shape(), dy.dtype(), dy.device());
      RT_KERNEL(dy.device(), "conv2d_backward", conv2d_backward_data)(dy, sw, g, dx);
    }
    if (need_w || need_b) {
      dw = Tensor::empty(sw.shape(), dy.dtype(), dy.device());
      if (need_b) db = Tensor::empty(Shape{g.k}, dy.dtype(), dy.device());
      RT_KERNEL(dy.device(), "conv2d_backward", conv2d_backward_weights)(sx, dy, g, dw, need_b ? &db : nullptr);
      if (!need_w) dw = Tensor();
    }
    detail::after_op(dy.device(), "conv2d_backward");
    return Grads{dx, dw, db};
  });
}

// ---------------------------------------------------------------------------------------------------
// Pooling (batch norm: core/ops_norm.cpp)

namespace {
ConvGeometry pool_geometry(const char* op, const Tensor& x, const Pool2dParams& p) {
  check_floating(op, x);
  if (x.ndim() != 4) RT_THROW("op '", op, "': expected (N, H, W, C), got ", x.describe());
  if (p.kernel_h < 1 || p.kernel_w < 1 || p.stride_h < 1 || p.stride_w < 1 || p.pad_h < 0 || p.pad_w < 0 ||
      2 * p.pad_h > p.kernel_h || 2 * p.pad_w > p.kernel_w)
    RT_THROW("op '", op, "': kernel (", p.kernel_h, ", ", p.kernel_w, ") and stride (", p.stride_h, ", ", p.stride_w,
             ") must be >= 1 and padding (", p.pad_h, ", ", p.pad_w, ") at most half the kernel");
  ConvGeometry g;
  g.n = x.size(0);
  g.h = x.size(1);
  g.w = x.size(2);
  g.c = g.k = x.size(3);
  g.r = p.kernel_h;
  g.s = p.kernel_w;
  g.stride_h = p.stride_h;
  g.stride_w = p.stride_w;
  g.pad_h = p.pad_h;
  g.pad_w = p.pad_w;
  g.p = (g.h + 2 * g.pad_h - g.r) / g.stride_h + 1;
  g.q = (g.w + 2 * g.pad_w - g.s) / g.stride_w + 1;
  if (g.h + 2 * g.pad_h < g.r || g.w + 2 * g.pad_w < g.s)
    RT_THROW("op '", op, "': input ", x.describe(), " is smaller than the ", g.r, "x", g.s, " window");
  return g;
}
}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dParams& params) {
  const ConvGeometry g = pool_geometry("max_pool2d", x, params);
  Tensor y = Tensor::empty(Shape{g.n, g.p, g.q, g.c}, x.dtype(), x.device());
  Tensor argmax = Tensor::empty(y.shape(), DType::I64, x.device());
  RT_KERNEL(x.device(), "max_pool2d", max_pool2d_forward)(x, g, y, argmax);
  detail::after_op(x.device(), "max_pool2d");
  if (!needs_grad({&x})) return y;
  return record("max_pool2d", {&x}, y, [argmax, g](const Tensor& dy) {
    Tensor dx = Tensor::empty(Shape{g.n, g.h, g.w, g.c}, dy.dtype(), dy.device());
    RT_KERNEL(dy.device(), "max_pool2d_backward", max_pool2d_backward)(dy, argmax, g, dx);
    detail::after_op(dy.device(), "max_pool2d_backward");
    return Grads{dx};
  });
}

Tensor avg_pool2d(const Tensor& x, const Pool2dParams& params) {
  const ConvGeometry g = pool_geometry("avg_pool2d", x, params);
  Tensor y = Tensor::empty(Shape{g.n, g.p, g.q, g.c}, x.dtype(), x.device());
  RT_KERNEL(x.device(), "avg_pool2d", avg_pool2d_forward)(x, g, y);
  detail::after_op(x.device(), "avg_pool2d");
  if (!needs_grad({&x})) return y;
  return record("avg_pool2d", {&x}, y, [g](const Tensor& dy) {
    Tensor dx = Tensor::empty(Shape{g.n, g.h, g.w, g.c}, dy.dtype(), dy.device());
    RT_KERNEL(dy.device(), "avg_pool2d_backward", avg_pool2d_backward)(dy, g, dx);
    detail::after_op(dy.device(), "avg_pool2d_backward");
    return Grads{dx};
  });
}

Tensor global_avg_pool(const Tensor& x) {
  if (x.ndim() != 4) RT_THROW("op 'global_avg_pool': expected (N, H, W, C), got ", x.describe());
  return mean(x.reshape(Shape{x.size(0), x.size(1) * x.size(2), x.size(3)}), 1);
}

// ---------------------------------------------------------------------------------------------------
// Softmax family

namespace {
Tensor softmax_impl(const Tensor& x, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  check_floating(name, x);
  RT_CHECK(x.ndim() >= 1, "op '", name, "' needs at least one dim, got ", x.describe());
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  RT_KERNEL(x.device(), name, softmax)(x, rows, cols, log, out);
  detail::after_op(x.device(), name);
  if (!needs_grad({&x})) return out;
  Tensor so = out.detach();
  return record(name, {&x}, out, [so, rows, cols, log, name](const Tensor& g) {
    Tensor dx = Tensor::empty(so.shape(), g.dtype(), g.device());
    RT_KERNEL(g.device(), name, softmax_backward)(so, g, rows, cols, log, dx);
    detail::after_op(g.device(), name);
    return Grads{dx};
  });
}
}  // namespace

Tensor softmax(const Tensor& x) { return softmax_impl(x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_impl(x, true); }

// cross_entropy: core/ops_nn.cpp (any leading dims, an ignore index, class weights).

// ---------------------------------------------------------------------------------------------------
// Dropout

Tensor dropout(const Tensor& x, double p, bool training, uint64_t seed, uint64_t stream, int64_t first) {
  check_floating("dropout", x);
  if (!(p >= 0.0 && p < 1.0)) RT_THROW("op 'dropout': probability must be in [0, 1), got ", p);
  if (!training || p == 0.0) return x;
  if (first < 0) RT_THROW("op 'dropout': first element ", first, " is negative");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mask = Tensor::empty(x.shape(), x.dtype(), x.device());
  RT_KERNEL(x.device(), "dropout", dropout)(x, p, seed, stream, first, out, mask);
  detail::after_op(x.device(), "dropout");
  if (!needs_grad({&x})) return out;
  return record("dropout", {&x}, out, [mask](const Tensor& g) { return Grads{mul(g, mask)}; });
}

Tensor dropout(const Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return dropout(x, p, training, 0, 0);
  const uint64_t stream = next_rng_stream();
  const std::optional<std::pair<uint64_t, int64_t>> keyed = keyed_draw(stream);
  if (!keyed) return dropout(x, p, training, default_seed(), stream);
  // Under the per-sample keying each sample's elements are drawn at its place in the global batch.
  const int64_t per_sample = x.ndim() > 0 && x.size(0) > 0 ? x.numel() / x.size(0) : 0;
  return dropout(x, p, training, default_seed(), keyed->first, keyed->second * per_sample);
}

}  // namespace ringtrain
