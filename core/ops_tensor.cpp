// core/ops_tensor.cpp: the ops that move elements without arithmetic -- cat, split, chunk, narrow, select,
// permute, transpose, expand -- and where. Every one is a StridedCopy (core/kernels.h) through the device's
// strided_copy kernel, forward and backward; narrow and select on the first dim (and wherever the dims before
// are all 1) are views instead.
#include <algorithm>
#include <array>
#include <numeric>
#include <string>

#include "core/autograd.h"
#include "core/check.h"
#include "core/dispatch.h"
#include "core/ops.h"
#include "core/ops_internal.h"

namespace ringtrain {

using detail::check_same_device_dtype;
using detail::Grads;

namespace {

// Row-major element strides of a shape.
std::array<int64_t, kMaxDims> strides_of(const Shape& s) {
  std::array<int64_t, kMaxDims> st{};
  int64_t running = 1;
  for (int d = s.ndim() - 1; d >= 0; --d) {
    st[static_cast<size_t>(d)] = running;
    running *= s[d];
  }
  return st;
}

// A copy over `dims` from src (its strides and offset) into dst (its strides and offset).
StridedCopy strided(const Shape& dims, const std::array<int64_t, kMaxDims>& src_stride, int64_t src_offset,
                    const std::array<int64_t, kMaxDims>& dst_stride, int64_t dst_offset) {
  StridedCopy c;
  c.ndim = dims.ndim();
  for (int d = 0; d < c.ndim; ++d) {
    c.dims[d] = dims[d];
    c.src_stride[d] = src_stride[static_cast<size_t>(d)];
    c.dst_stride[d] = dst_stride[static_cast<size_t>(d)];
  }
  c.src_offset = src_offset;
  c.dst_offset = dst_offset;
  return c;
}

void run_copy(const char* op, const Tensor& src, Tensor& dst, const StridedCopy& c) {
  int64_t n = 1;
  for (int d = 0; d < c.ndim; ++d) n *= c.dims[d];
  if (n == 0) return;
  RT_KERNEL(dst.device(), op, strided_copy)(src, dst, c);
  detail::after_op(dst.device(), op);
}

Shape with_dim(const Shape& s, int dim, int64_t size) {
  Shape out = s;
  out[dim] = size;
  return out;
}

int64_t outer_of(const Shape& s, int dim) {
  int64_t outer = 1;
  for (int d = 0; d < dim; ++d) outer *= s[d];
  return outer;
}

// g (the narrowed shape) into zeros of `full` at [start, start + length) of dim.
Tensor unnarrow(const Tensor& g, const Shape& full, int dim, int64_t start) {
  Tensor out = Tensor::zeros(full, g.dtype(), g.device());
  const auto fs = strides_of(full);
  run_copy("narrow_backward", g, out,
           strided(g.shape(), strides_of(g.shape()), 0, fs, start * fs[static_cast<size_t>(dim)]));
  return out;
}

std::string dims_text(const std::vector<int>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

}  // namespace

Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length) {
  RT_CHECK(x.defined(), "op 'narrow': undefined input");
  RT_CHECK(x.ndim() >= 1, "op 'narrow': ", x.describe(), " has no dim to narrow");
  const int d = x.shape().wrap_dim(dim, "narrow");
  const int64_t size = x.size(d);
  if (start < 0) start += size;
  if (start < 0 || length < 0 || start > size || length > size - start)
    RT_THROW("op 'narrow': [", start, ", ", start + length, ") of dim ", d, " is outside ", x.describe());
  const Shape out_shape = with_dim(x.shape(), d, length);
  if (outer_of(x.shape(), d) == 1) {
    // The dims before are all 1: the elements are one contiguous run, a view (differentiable as slice is).
    std::vector<int64_t> rows(x.shape().begin() + d, x.shape().end());
    return x.reshape(Shape(std::span<const int64_t>(rows))).slice(start, start + length).reshape(out_shape);
  }
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  const auto xs = strides_of(x.shape());
  run_copy("narrow", x, out, strided(out_shape, xs, start * xs[static_cast<size_t>(d)], strides_of(out_shape), 0));
  if (!needs_grad({&x})) return out;
  const Shape full = x.shape();
  return record("narrow", {&x}, out, [full, d, start](const Tensor& g) { return Grads{unnarrow(g, full, d, start)}; });
}

Tensor select(const Tensor& x, int dim, int64_t index) {
  RT_CHECK(x.defined(), "op 'select': undefined input");
  RT_CHECK(x.ndim() >= 1, "op 'select': ", x.describe(), " has no dim to select from");
  const int d = x.shape().wrap_dim(dim, "select");
  const int64_t size = x.size(d);
  if (index < -size || index >= size)
    RT_THROW("op 'select': index ", index, " is outside dim ", d, " (size ", size, ") of ", x.describe());
  if (index < 0) index += size;
  std::vector<int64_t> dims;
  for (int i = 0; i < x.ndim(); ++i)
    if (i != d) dims.push_back(x.size(i));
  return narrow(x, d, index, 1).reshape(Shape(std::span<const int64_t>(dims)));
}

Tensor cat(const std::vector<Tensor>& tensors, int dim) {
  RT_CHECK(!tensors.empty(), "op 'cat': no tensors to concatenate");
  const Tensor& first = tensors.front();
  RT_CHECK(first.defined(), "op 'cat': tensor 0 is undefined");
  RT_CHECK(first.ndim() >= 1, "op 'cat': tensor 0 ", first.describe(), " has no dims to concatenate along");
  const int d = first.shape().wrap_dim(dim, "cat");
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    RT_CHECK(t.defined(), "op 'cat': tensor ", i, " is undefined");
    check_same_device_dtype("cat", first, t);
    bool same = t.ndim() == first.ndim();
    for (int k = 0; same && k < t.ndim(); ++k) same = k == d || t.size(k) == first.size(k);
    if (!same)
      RT_THROW("op 'cat': tensor ", i, " ", t.describe(), " does not match tensor 0 ", first.describe(),
               " in every dim but dim ", d);
    total += t.size(d);
  }
  if (tensors.size() == 1) return first;
  const Shape out_shape = with_dim(first.shape(), d, total);
  Tensor out = Tensor::empty(out_shape, first.dtype(), first.device());
  const auto os = strides_of(out_shape);
  int64_t at = 0;
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) {
    run_copy("cat", t, out, strided(t.shape(), strides_of(t.shape()), 0, os, at * os[static_cast<size_t>(d)]));
    at += t.size(d);
    sizes.push_back(t.size(d));
  }
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : tensors) inputs.push_back(&t);
  bool any = false;
  for (const Tensor* t : inputs) any = any || needs_grad({t});
  if (!any) return out;
  return record("cat", inputs, out, [sizes, d](const Tensor& g) {
    Grads grads;
    int64_t start = 0;
    for (int64_t s : sizes) {
      grads.push_back(narrow(g, d, start, s));
      start += s;
    }
    return grads;
  });
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim) {
  RT_CHECK(x.defined(), "op 'split': undefined input");
  RT_CHECK(x.ndim() >= 1, "op 'split': ", x.describe(), " has no dim to split");
  const int d = x.shape().wrap_dim(dim, "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) RT_THROW("op 'split': a negative size ", s, " for dim ", d, " of ", x.describe());
    total += s;
  }
  if (total != x.size(d)) {
    std::string text;
    for (int64_t s : sizes) text += (text.empty() ? "" : ", ") + std::to_string(s);
    RT_THROW("op 'split': sizes (", text, ") add up to ", total, ", not to dim ", d, " (", x.size(d), ") of ",
             x.describe());
  }
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, d, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int dim) {
  RT_CHECK(x.defined(), "op 'split': undefined input");
  RT_CHECK(x.ndim() >= 1, "op 'split': ", x.describe(), " has no dim to split");
  const int d = x.shape().wrap_dim(dim, "split");
  const int64_t n = x.size(d);
  if (size <= 0 && !(size == 0 && n == 0))
    RT_THROW("op 'split': pieces of ", size, " cannot split dim ", d, " of ", x.describe(), " (a size >= 1)");
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += size) sizes.push_back(std::min(size, n - at));
  if (sizes.empty()) sizes.push_back(0);  // torch.split of an empty dim: one empty piece
  return split(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int dim) {
  RT_CHECK(x.defined(), "op 'chunk': undefined input");
  RT_CHECK(x.ndim() >= 1, "op 'chunk': ", x.describe(), " has no dim to chunk");
  if (chunks < 1) RT_THROW("op 'chunk': ", chunks, " chunks of ", x.describe(), " (at least 1)");
  const int d = x.shape().wrap_dim(dim, "chunk");
  const int64_t n = x.size(d);
  return split(x, n == 0 ? int64_t{0} : (n + chunks - 1) / chunks, d);
}

Tensor permute(const Tensor& x, const std::vector<int>& dims) {
  RT_CHECK(x.defined(), "op 'permute': undefined input");
  const int nd = x.ndim();
  if (static_cast<int>(dims.size()) != nd)
    RT_THROW("op 'permute': ", dims.size(), " dims ", dims_text(dims), " for ", x.describe(), " of ", nd, " dims");
  std::vector<int> perm(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < -nd || dims[i] >= nd)
      RT_THROW("op 'permute': dims ", dims_text(dims), " are not a permutation of the ", nd, " dims of ", x.describe());
    perm[i] = dims[i] < 0 ? dims[i] + nd : dims[i];
    if (seen[static_cast<size_t>(perm[i])])
      RT_THROW("op 'permute': dims ", dims_text(dims), " name dim ", perm[i], " twice (for ", x.describe(), ")");
    seen[static_cast<size_t>(perm[i])] = true;
  }
  bool identity = true;
  for (int i = 0; i < nd; ++i) identity = identity && perm[static_cast<size_t>(i)] == i;
  if (identity) return x;
  std::vector<int64_t> out_dims(static_cast<size_t>(nd));
  const auto xs = strides_of(x.shape());
  std::array<int64_t, kMaxDims> src{};
  for (int i = 0; i < nd; ++i) {
    out_dims[static_cast<size_t>(i)] = x.size(perm[static_cast<size_t>(i)]);
    src[static_cast<size_t>(i)] = xs[static_cast<size_t>(perm[static_cast<size_t>(i)])];
  }
  const Shape out_shape{std::span<const int64_t>(out_dims)};
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  run_copy("permute", x, out, strided(out_shape, src, 0, strides_of(out_shape), 0));
  if (!needs_grad({&x})) return out;
  std::vector<int> inverse(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i) inverse[static_cast<size_t>(perm[static_cast<size_t>(i)])] = i;
  return record("permute", {&x}, out, [inverse](const Tensor& g) { return Grads{permute(g, inverse)}; });
}

Tensor transpose(const Tensor& x, int dim0, int dim1) {
  RT_CHECK(x.defined(), "op 'transpose': undefined input");
  const int a = x.shape().wrap_dim(dim0, "transpose"), b = x.shape().wrap_dim(dim1, "transpose");
  std::vector<int> dims(static_cast<size_t>(x.ndim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[static_cast<size_t>(a)], dims[static_cast<size_t>(b)]);
  return permute(x, dims);
}

Tensor contiguous(const Tensor& x) {
  RT_CHECK(x.defined(), "op 'contiguous': undefined input");
  return x;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  RT_CHECK(x.defined(), "op 'expand': undefined input");
  if (x.shape() == shape) return x;
  if (shape.ndim() < x.ndim())
    RT_THROW("op 'expand': ", x.describe(), " cannot expand to the shape ", shape, " of fewer dims");
  const int lead = shape.ndim() - x.ndim();
  const auto xs = strides_of(x.shape());
  std::array<int64_t, kMaxDims> src{};
  for (int d = 0; d < shape.ndim(); ++d) {
    if (d < lead) continue;  // a new leading dim repeats the whole of x: stride 0
    const int64_t in = x.size(d - lead);
    if (in != shape[d] && in != 1)
      RT_THROW("op 'expand': ", x.describe(), " cannot expand to ", shape, " (dim ", d, ": ", in, " vs ", shape[d],
               ")");
    src[static_cast<size_t>(d)] = in == 1 && shape[d] != 1 ? 0 : xs[static_cast<size_t>(d - lead)];
  }
  for (int d = 0; d < shape.ndim(); ++d)
    if (shape[d] < 0) RT_THROW("op 'expand': a negative size in ", shape);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  run_copy("expand", x, out, strided(shape, src, 0, strides_of(shape), 0));
  if (!needs_grad({&x})) return out;
  const Shape in_shape = x.shape();
  return record("expand", {&x}, out, [in_shape](const Tensor& g) { return Grads{sum_to(g, in_shape)}; });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  RT_CHECK(cond.defined(), "op 'where': undefined condition");
  check_same_device_dtype("where", a, b);
  if (cond.dtype() != DType::U8)
    RT_THROW("op 'where': the condition must be u8 (what comparisons return), got ", cond.describe());
  if (cond.device() != a.device())
    RT_THROW("op 'where': the condition ", cond.describe(), " and the values ", a.describe(),
             " are on different devices");
  const Shape ab = detail::broadcast_shapes("where", a, b);
  const Shape shape = detail::broadcast_shapes("where", cond.shape(), ab);
  Tensor c = expand(cond, shape), ea, eb;
  {
    NoGradGuard no_grad;  // the backward below differentiates where itself
    ea = expand(a.detach(), shape);
    eb = expand(b.detach(), shape);
  }
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (out.numel() > 0) {
    RT_KERNEL(out.device(), "where", where)(c, ea, eb, out);
    detail::after_op(out.device(), "where");
  }
  if (!needs_grad({&a, &b})) return out;
  const Shape sa = a.shape(), sb = b.shape();
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  return record("where", {&a, &b}, out, [c, sa, sb, need_a, need_b](const Tensor& g) {
    const Tensor zero = Tensor::zeros(Shape{}, g.dtype(), g.device());
    return Grads{need_a ? sum_to(where(c, g, zero), sa) : Tensor(), need_b ? sum_to(where(c, zero, g), sb) : Tensor()};
  });
}

}  // namespace ringtrain
