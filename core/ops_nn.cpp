// core/ops_nn.cpp: the layers' ops beyond ResNet's: activations and clamp, layer and group norm, adaptive average
// pooling and upsampling (the resampling kernel and its tap tables), transposed convolution, drop_path (with
// the per-sample draws that do not depend on the world size) and cross-entropy over any leading dims with an
// ignore index and class weights. Checks, dispatch, forward and backward, as core/ops.cpp.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/device.h"
#include "core/dispatch.h"
#include "core/ops.h"
#include "core/ops_internal.h"

namespace ringtrain {

using detail::check_floating;
using detail::check_same_device_dtype;
using detail::Grads;

// ---------------------------------------------------------------------------------------------------
// Activations

namespace {

Tensor activation_op(ActivationOp op, const char* name, const Tensor& x, double a, double b) {
  check_floating(name, x);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) {
    RT_KERNEL(x.device(), name, activation)(op, x, a, b, out);
    detail::after_op(x.device(), name);
  }
  if (!needs_grad({&x})) return out;
  Tensor sx = x.detach();
  return record(name, {&x}, out, [op, name, sx, a, b](const Tensor& g) {
    Tensor dx = Tensor::empty(sx.shape(), sx.dtype(), sx.device());
    if (dx.numel() > 0) {
      RT_KERNEL(g.device(), name, activation_backward)(op, sx, g, a, b, dx);
      detail::after_op(g.device(), name);
    }
    return Grads{dx};
  });
}

}  // namespace

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  if (!min && !max) RT_THROW("op 'clamp': give a min, a max or both (of ", x.describe(), ")");
  if ((min && std::isnan(*min)) || (max && std::isnan(*max))) RT_THROW("op 'clamp': a bound is NaN");
  // PyTorch: min above max clamps everything to max.
  const double lo = min ? *min : -std::numeric_limits<double>::infinity();
  const double hi = max ? *max : std::numeric_limits<double>::infinity();
  return activation_op(ActivationOp::Clamp, "clamp", x, min && max && lo > hi ? hi : lo, hi);
}

Tensor hardtanh(const Tensor& x, double min, double max) {
  if (!(min <= max)) RT_THROW("op 'hardtanh': min ", min, " must not be above max ", max);
  return activation_op(ActivationOp::Hardtanh, "hardtanh", x, min, max);
}
Tensor relu6(const Tensor& x) { return activation_op(ActivationOp::Hardtanh, "relu6", x, 0.0, 6.0); }
Tensor leaky_relu(const Tensor& x, double slope) {
  if (!std::isfinite(slope)) RT_THROW("op 'leaky_relu': the slope must be finite, got ", slope);
  return activation_op(ActivationOp::LeakyRelu, "leaky_relu", x, slope, 0.0);
}
Tensor gelu(const Tensor& x, GeluApproximation approximation) {
  return approximation == GeluApproximation::Tanh ? activation_op(ActivationOp::GeluTanh, "gelu_tanh", x, 0, 0)
                                                  : activation_op(ActivationOp::Gelu, "gelu", x, 0, 0);
}
Tensor silu(const Tensor& x) { return activation_op(ActivationOp::Silu, "silu", x, 0, 0); }
Tensor hardswish(const Tensor& x) { return activation_op(ActivationOp::Hardswish, "hardswish", x, 0, 0); }
Tensor hardsigmoid(const Tensor& x) { return activation_op(ActivationOp::Hardsigmoid, "hardsigmoid", x, 0, 0); }

// ---------------------------------------------------------------------------------------------------
// Layer and group norm: one kernel family (core/kernels.h group_norm_*), LayerNorm its one-group case.

namespace {

Tensor normalize(const char* op, const Tensor& x, const GroupNormShape& shape, const Tensor& weight, const Tensor& bias,
                 double eps) {
  const DType param_dtype = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  if (weight.defined() != bias.defined())
    RT_THROW("op '", op, "': give both weight and bias or neither (", weight.defined() ? "no bias" : "no weight", ")");
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    if (t->ndim() != 1 || t->size(0) != shape.c || t->dtype() != param_dtype || t->device() != x.device())
      RT_THROW("op '", op, "': ", t->describe(), " must be ", dtype_name(param_dtype), "[", shape.c, "] on ",
               x.device().str(), " for input ", x.describe());
  }
  if (!(eps > 0) || !std::isfinite(eps)) RT_THROW("op '", op, "': eps must be > 0, got ", eps);
  const bool affine = weight.defined();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty(Shape{shape.n, shape.groups}, param_dtype, x.device());
  Tensor rstd = Tensor::empty(Shape{shape.n, shape.groups}, param_dtype, x.device());
  if (x.numel() > 0) {
    RT_KERNEL(x.device(), op, group_norm_forward)
    (x, affine ? &weight : nullptr, affine ? &bias : nullptr, shape, eps, y, mean, rstd);
    detail::after_op(x.device(), op);
  }
  if (!needs_grad({&x, &weight, &bias})) return y;
  Tensor sx = x.detach(), sw = affine ? weight.detach() : Tensor();
  auto backward = [op, sx, sw, mean, rstd, shape, affine](const Tensor& dy) {
    Tensor dx = Tensor::empty(sx.shape(), sx.dtype(), sx.device());
    Tensor dw = affine ? Tensor::empty(sw.shape(), sw.dtype(), sw.device()) : Tensor();
    Tensor db = affine ? Tensor::empty(sw.shape(), sw.dtype(), sw.device()) : Tensor();
    if (dx.numel() > 0) {
      RT_KERNEL(dy.device(), op, group_norm_backward)
      (sx, dy, affine ? &sw : nullptr, mean, rstd, shape, dx, affine ? &dw : nullptr, affine ? &db : nullptr);
      detail::after_op(dy.device(), op);
    } else if (affine) {
      dw.zero_();
      db.zero_();
    }
    return affine ? Grads{dx, dw, db} : Grads{dx};
  };
  return affine ? record(op, {&x, &weight, &bias}, y, backward) : record(op, {&x}, y, backward);
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_floating("layer_norm", x);
  if (x.ndim() < 1 || x.size(-1) == 0) RT_THROW("op 'layer_norm': expected (..., C) with C > 0, got ", x.describe());
  const int64_t c = x.size(-1);
  return normalize("layer_norm", x, GroupNormShape{x.numel() / c, 1, c, 1}, weight, bias, eps);
}

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps) {
  check_floating("group_norm", x);
  if (x.ndim() < 2) RT_THROW("op 'group_norm': expected (N, ..., C), got ", x.describe());
  const int64_t n = x.size(0), c = x.size(-1);
  if (groups < 1 || c % groups != 0)
    RT_THROW("op 'group_norm': ", groups, " groups do not divide the ", c, " channels of ", x.describe());
  const int64_t s = n * c > 0 ? x.numel() / (n * c) : 0;
  if (x.numel() > 0 && s * (c / groups) < 1)
    RT_THROW("op 'group_norm': a group of ", x.describe(), " has no values to normalise");
  return normalize("group_norm", x, GroupNormShape{n, s, c, groups}, weight, bias, eps);
}

// ---------------------------------------------------------------------------------------------------
// Resampling: adaptive average pooling and upsampling as tap tables (core/kernels.h ResampleTaps)

namespace {

// One dim's table: output o reads inputs index[offsets[o] .. offsets[o + 1]) with weights.
struct Taps1D {
  std::vector<int32_t> offsets{0}, index;
  std::vector<double> weight;
  void add(int64_t in, double w) {
    index.push_back(static_cast<int32_t>(in));
    weight.push_back(w);
  }
  void close() { offsets.push_back(static_cast<int32_t>(index.size())); }
};

// PyTorch's adaptive pooling windows: [floor(o in / out), ceil((o + 1) in / out)).
Taps1D adaptive_taps(int64_t in, int64_t out) {
  Taps1D t;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = (o * in) / out, end = ((o + 1) * in + out - 1) / out;
    for (int64_t i = start; i < end; ++i) t.add(i, 1.0 / static_cast<double>(end - start));
    t.close();
  }
  return t;
}

// PyTorch's source index of nearest / nearest-exact upsampling, computed in float as its kernels do (with
// 1 / the scale factor when one was given, else in / out).
Taps1D nearest_taps(int64_t in, int64_t out, double scale_factor, bool exact) {
  const float scale =
      scale_factor > 0 ? static_cast<float>(1.0 / scale_factor) : static_cast<float>(in) / static_cast<float>(out);
  Taps1D t;
  for (int64_t o = 0; o < out; ++o) {
    int64_t src = 0;
    if (exact) {
      src = static_cast<int64_t>(std::floor(static_cast<float>((static_cast<double>(o) + 0.5) * scale)));
    } else if (out == in) {
      src = o;
    } else if (out == 2 * in) {
      src = o >> 1;
    } else {
      src = static_cast<int64_t>(std::floor(static_cast<float>(o) * scale));
    }
    t.add(std::min(src, in - 1), 1.0);
    t.close();
  }
  return t;
}

// PyTorch's bilinear source index and weights, in the op's compute type T (float below f64).
template <typename T>
Taps1D bilinear_taps(int64_t in, int64_t out, double scale_factor, bool align_corners) {
  T ratio;
  if (align_corners)
    ratio = out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  else
    ratio = scale_factor > 0 ? static_cast<T>(1.0 / scale_factor) : static_cast<T>(in) / static_cast<T>(out);
  Taps1D t;
  for (int64_t o = 0; o < out; ++o) {
    if (in == out) {
      t.add(o, 1.0);
      t.add(o, 0.0);
    } else {
      T real = align_corners ? ratio * static_cast<T>(o) : ratio * (static_cast<T>(o) + T(0.5)) - T(0.5);
      if (!align_corners && real < T(0)) real = T(0);
      const int64_t i0 = std::min(static_cast<int64_t>(std::floor(real)), in - 1);
      const int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
      const T lambda1 = std::min(std::max(real - static_cast<T>(i0), T(0)), T(1));
      const T lambda0 = T(1) - lambda1;
      t.add(i0, static_cast<double>(lambda0));
      t.add(i1, static_cast<double>(lambda1));
    }
    t.close();
  }
  return t;
}

// The transposed table: input i gathers from the outputs whose taps read it, in output order.
Taps1D transposed(const Taps1D& t, int64_t in) {
  std::vector<std::vector<std::pair<int32_t, double>>> by_input(static_cast<size_t>(in));
  const auto out = static_cast<int64_t>(t.offsets.size()) - 1;
  for (int64_t o = 0; o < out; ++o)
    for (int32_t k = t.offsets[static_cast<size_t>(o)]; k < t.offsets[static_cast<size_t>(o) + 1]; ++k)
      by_input[static_cast<size_t>(t.index[static_cast<size_t>(k)])].emplace_back(static_cast<int32_t>(o),
                                                                                  t.weight[static_cast<size_t>(k)]);
  Taps1D r;
  for (const auto& taps : by_input) {
    for (const auto& [o, w] : taps) r.add(o, w);
    r.close();
  }
  return r;
}

// The tables on the device, made once per (geometry, device): the kernels then read tensors that outlive any
// one call (a CUDA graph's replays too) and no table is copied in a steady step.
struct TapsKey {
  int kind;  // 0 adaptive, 1 nearest, 2 nearest-exact, 3 bilinear
  int64_t in, out;
  uint64_t scale_bits;
  bool align_corners, transposed, f64;
  int device_type, device_index;
  bool operator<(const TapsKey& o) const {
    return std::tie(kind, in, out, scale_bits, align_corners, transposed, f64, device_type, device_index) <
           std::tie(o.kind, o.in, o.out, o.scale_bits, o.align_corners, o.transposed, o.f64, o.device_type,
                    o.device_index);
  }
};
struct DeviceTaps {
  Tensor offsets, index, weight;
};

DeviceTaps device_taps(const TapsKey& key) {
  static std::mutex mutex;
  static std::map<TapsKey, DeviceTaps> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  double scale = 0;
  std::memcpy(&scale, &key.scale_bits, sizeof scale);
  Taps1D t;
  switch (key.kind) {
    case 0:
      t = adaptive_taps(key.in, key.out);
      break;
    case 1:
    case 2:
      t = nearest_taps(key.in, key.out, scale, key.kind == 2);
      break;
    default:
      t = key.f64 ? bilinear_taps<double>(key.in, key.out, scale, key.align_corners)
                  : bilinear_taps<float>(key.in, key.out, scale, key.align_corners);
  }
  if (key.transposed) t = transposed(t, key.in);
  const Device device{static_cast<DeviceType>(key.device_type), key.device_index};
  auto ints = [&](const std::vector<int32_t>& v) {
    return Tensor::from_vector(std::vector<double>(v.begin(), v.end()), Shape{static_cast<int64_t>(v.size())},
                               DType::I32, device);
  };
  DeviceTaps d{ints(t.offsets), ints(t.index),
               Tensor::from_vector(t.weight, Shape{static_cast<int64_t>(t.weight.size())},
                                   key.f64 ? DType::F64 : DType::F32, device)};
  if (cache.size() >= 512) cache.clear();
  cache.emplace(key, d);
  return d;
}

struct ResamplePlan {
  int kind = 0;
  double scale_h = 0, scale_w = 0;
  bool align_corners = false;
};

ResampleTaps taps_for(const ResamplePlan& plan, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w,
                      bool transposed, bool f64, Device device) {
  auto key = [&](int64_t in, int64_t out, double scale) {
    TapsKey k{plan.kind, in, out, 0, plan.align_corners, transposed, f64, static_cast<int>(device.type), device.index};
    std::memcpy(&k.scale_bits, &scale, sizeof scale);
    return k;
  };
  const DeviceTaps h = device_taps(key(in_h, out_h, plan.scale_h)), w = device_taps(key(in_w, out_w, plan.scale_w));
  return ResampleTaps{h.offsets, h.index, h.weight, w.offsets, w.index, w.weight};
}

Tensor resample(const char* op, const Tensor& x, const ResamplePlan& plan, int64_t out_h, int64_t out_w) {
  const int64_t n = x.size(0), h = x.size(1), w = x.size(2), c = x.size(3);
  const bool f64 = x.dtype() == DType::F64;
  Tensor y = Tensor::empty(Shape{n, out_h, out_w, c}, x.dtype(), x.device());
  if (y.numel() > 0) {
    RT_KERNEL(x.device(), op, resample2d)(x, taps_for(plan, h, w, out_h, out_w, false, f64, x.device()), y);
    detail::after_op(x.device(), op);
  }
  if (!needs_grad({&x})) return y;
  return record(op, {&x}, y, [op, plan, n, h, w, c, out_h, out_w, f64](const Tensor& dy) {
    Tensor dx = Tensor::empty(Shape{n, h, w, c}, dy.dtype(), dy.device());
    if (dx.numel() > 0) {
      RT_KERNEL(dy.device(), op, resample2d)(dy, taps_for(plan, h, w, out_h, out_w, true, f64, dy.device()), dx);
      detail::after_op(dy.device(), op);
    }
    return Grads{dx};
  });
}

void check_image(const char* op, const Tensor& x) {
  check_floating(op, x);
  if (x.ndim() != 4) RT_THROW("op '", op, "': expected an NHWC image batch (N, H, W, C), got ", x.describe());
}

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  check_image("adaptive_avg_pool2d", x);
  if (out_h < 1 || out_w < 1)
    RT_THROW("op 'adaptive_avg_pool2d': the output size ", out_h, "x", out_w, " must be at least 1x1 (input ",
             x.describe(), ")");
  if ((x.size(1) == 0 || x.size(2) == 0) && x.numel() == 0 && x.size(0) * x.size(3) > 0)
    RT_THROW("op 'adaptive_avg_pool2d': ", x.describe(), " has no pixels to average");
  return resample("adaptive_avg_pool2d", x, ResamplePlan{0, 0, 0, false}, out_h, out_w);
}

Tensor upsample(const Tensor& x, const UpsampleOptions& o) {
  check_image("upsample", x);
  const bool sized = o.out_h > 0 || o.out_w > 0, scaled = o.scale_h != 0 || o.scale_w != 0;
  if (sized == scaled)
    RT_THROW("op 'upsample': give either an output size or scale factors (", sized ? "both" : "neither", " given) for ",
             x.describe());
  if (sized && (o.out_h < 1 || o.out_w < 1))
    RT_THROW("op 'upsample': the output size ", o.out_h, "x", o.out_w, " must be at least 1x1");
  if (scaled && !(o.scale_h > 0 && o.scale_w > 0 && std::isfinite(o.scale_h) && std::isfinite(o.scale_w)))
    RT_THROW("op 'upsample': scale factors must be finite and > 0, got ", o.scale_h, " x ", o.scale_w);
  if (o.align_corners && o.mode != UpsampleMode::Bilinear)
    RT_THROW("op 'upsample': align_corners applies to bilinear upsampling only (PyTorch refuses it for nearest)");
  if (x.size(1) == 0 || x.size(2) == 0) RT_THROW("op 'upsample': ", x.describe(), " has no pixels");
  const int64_t out_h = sized ? o.out_h : static_cast<int64_t>(std::floor(static_cast<double>(x.size(1)) * o.scale_h));
  const int64_t out_w = sized ? o.out_w : static_cast<int64_t>(std::floor(static_cast<double>(x.size(2)) * o.scale_w));
  if (out_h < 1 || out_w < 1)
    RT_THROW("op 'upsample': scale factors ", o.scale_h, " x ", o.scale_w, " leave ", x.describe(), " empty");
  const int kind = o.mode == UpsampleMode::Nearest ? 1 : o.mode == UpsampleMode::NearestExact ? 2 : 3;
  const char* op = kind == 3 ? "upsample_bilinear" : "upsample_nearest";
  return resample(op, x, ResamplePlan{kind, scaled ? o.scale_h : 0, scaled ? o.scale_w : 0, o.align_corners}, out_h,
                  out_w);
}

// ---------------------------------------------------------------------------------------------------
// Transposed convolution: the convolution kernels with the roles of input and output exchanged

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvTranspose2dParams& p) {
  if (auto dtype = detail::autocast_for(x, weight))
    return conv_transpose2d(autocast_cast(x, *dtype), autocast_cast(weight, *dtype),
                            detail::cast_if_defined(bias, *dtype), p);
  check_same_device_dtype("conv_transpose2d", x, weight);
  check_floating("conv_transpose2d", x);
  if (p.stride_h < 1 || p.stride_w < 1 || p.dilation_h < 1 || p.dilation_w < 1 || p.pad_h < 0 || p.pad_w < 0 ||
      p.groups < 1 || p.output_pad_h < 0 || p.output_pad_w < 0)
    RT_THROW("op 'conv_transpose2d': stride (", p.stride_h, ", ", p.stride_w, ") and dilation (", p.dilation_h, ", ",
             p.dilation_w, ") must be >= 1, padding (", p.pad_h, ", ", p.pad_w, "), output padding (", p.output_pad_h,
             ", ", p.output_pad_w, ") >= 0 and groups (", p.groups, ") >= 1");
  if ((p.output_pad_h >= p.stride_h && p.output_pad_h >= p.dilation_h) ||
      (p.output_pad_w >= p.stride_w && p.output_pad_w >= p.dilation_w))
    RT_THROW("op 'conv_transpose2d': output padding (", p.output_pad_h, ", ", p.output_pad_w,
             ") must be smaller than the stride (", p.stride_h, ", ", p.stride_w, ") or the dilation (", p.dilation_h,
             ", ", p.dilation_w, ")");
  if (x.ndim() != 4 || weight.ndim() != 4)
    RT_THROW("op 'conv_transpose2d': expected input (N, H, W, Cin) and weight (Cin, R, S, Cout/groups), got ",
             x.describe(), " and ", weight.describe());
  const int64_t cin = x.size(3);
  if (weight.size(0) != cin || cin % p.groups != 0)
    RT_THROW("op 'conv_transpose2d': input ", x.describe(), " with ", p.groups, " group(s) needs weight (", cin,
             ", R, S, Cout/groups) with ", cin, " divisible by the groups, got ", weight.describe());
  // The convolution whose input gradient this is: its input is our output, its output our input.
  ConvGeometry g;
  g.n = x.size(0);
  g.k = cin;
  g.r = weight.size(1);
  g.s = weight.size(2);
  g.c = weight.size(3) * p.groups;
  g.p = x.size(1);
  g.q = x.size(2);
  g.stride_h = p.stride_h;
  g.stride_w = p.stride_w;
  g.pad_h = p.pad_h;
  g.pad_w = p.pad_w;
  g.dilation_h = p.dilation_h;
  g.dilation_w = p.dilation_w;
  g.groups = p.groups;
  g.h = (g.p - 1) * g.stride_h - 2 * g.pad_h + g.dilation_h * (g.r - 1) + p.output_pad_h + 1;
  g.w = (g.q - 1) * g.stride_w - 2 * g.pad_w + g.dilation_w * (g.s - 1) + p.output_pad_w + 1;
  if (g.h <= 0 || g.w <= 0)
    RT_THROW("op 'conv_transpose2d': input ", x.describe(), " with a ", g.r, "x", g.s, " filter, stride ", g.stride_h,
             " and padding ", g.pad_h, " gives an empty output (", g.h, "x", g.w, ")");
  RT_CHECK((g.h + 2 * g.pad_h - g.dilation_h * (g.r - 1) - 1) / g.stride_h + 1 == g.p &&
               (g.w + 2 * g.pad_w - g.dilation_w * (g.s - 1) - 1) / g.stride_w + 1 == g.q,
           "op 'conv_transpose2d': inconsistent geometry for ", x.describe());
  if (bias.defined()) {
    check_same_device_dtype("conv_transpose2d", x, bias);
    if (bias.ndim() != 1 || bias.size(0) != g.c)
      RT_THROW("op 'conv_transpose2d': bias ", bias.describe(), " does not match ", g.c, " output channels");
  }
  Tensor y = Tensor::empty(Shape{g.n, g.h, g.w, g.c}, x.dtype(), x.device());
  if (y.numel() > 0) {
    if (x.numel() == 0) {
      y.zero_();
    } else {
      RT_KERNEL(x.device(), "conv_transpose2d", conv2d_backward_data)(x, weight, g, y);
      detail::after_op(x.device(), "conv_transpose2d");
    }
  }
  if (needs_grad({&x, &weight})) {
    Tensor sx = x.detach(), sw = weight.detach();
    const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
    y = record("conv_transpose2d", {&x, &weight}, y, [sx, sw, g, need_x, need_w](const Tensor& dy) {
      Tensor dx, dw;
      if (need_x) {
        dx = Tensor::empty(sx.shape(), dy.dtype(), dy.device());
        RT_KERNEL(dy.device(), "conv_transpose2d_backward", conv2d_forward)(dy, sw, nullptr, g, dx);
      }
      if (need_w) {
        dw = Tensor::empty(sw.shape(), dy.dtype(), dy.device());
        RT_KERNEL(dy.device(), "conv_transpose2d_backward", conv2d_backward_weights)(dy, sx, g, dw, nullptr);
      }
      detail::after_op(dy.device(), "conv_transpose2d_backward");
      return Grads{dx, dw};
    });
  }
  return bias.defined() ? add(y, bias) : y;
}

// ---------------------------------------------------------------------------------------------------
// drop_path and the per-sample draws

namespace {
std::mutex g_draws_mutex;
SampleDraws g_draws;
}  // namespace

void set_sample_draws(const SampleDraws& draws) {
  std::lock_guard<std::mutex> lock(g_draws_mutex);
  g_draws = draws;
}
SampleDraws sample_draws() {
  std::lock_guard<std::mutex> lock(g_draws_mutex);
  return g_draws;
}

Tensor drop_path(const Tensor& x, double p, bool training, uint64_t seed, uint64_t stream, int64_t first_sample) {
  check_floating("drop_path", x);
  if (!(p >= 0.0 && p <= 1.0)) RT_THROW("op 'drop_path': probability must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  if (x.ndim() < 1) RT_THROW("op 'drop_path': expected (N, ...) samples, got ", x.describe());
  if (first_sample < 0) RT_THROW("op 'drop_path': first_sample ", first_sample, " is negative");
  std::vector<int64_t> dims(static_cast<size_t>(x.ndim()), 1);
  dims[0] = x.size(0);
  Tensor mask = Tensor::empty(Shape(std::span<const int64_t>(dims)), x.dtype(), x.device());
  if (mask.numel() > 0) {
    RT_KERNEL(x.device(), "drop_path", sample_mask)(mask, p, seed, stream, first_sample);
    detail::after_op(x.device(), "drop_path");
  }
  return mul(x, mask);
}

std::optional<std::pair<uint64_t, int64_t>> keyed_draw(uint64_t stream) {
  const SampleDraws d = sample_draws();
  if (!d.set) return std::nullopt;
  // Keyed by (step, place in the forward), in streams no counter reaches (the top bit set).
  const uint64_t place = stream - d.micro_origin;
  RT_CHECK(place < (uint64_t{1} << 24) && d.step < (uint64_t{1} << 39), "the per-sample keying: draw ", place,
           " of step ", d.step, " is outside the keyed streams");
  return std::pair<uint64_t, int64_t>{(uint64_t{1} << 63) | (d.step << 24) | place, d.first_sample};
}

Tensor drop_path(const Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return drop_path(x, p, training, 0, 0, 0);
  const uint64_t stream = next_rng_stream();
  const std::optional<std::pair<uint64_t, int64_t>> keyed = keyed_draw(stream);
  if (!keyed) return drop_path(x, p, training, default_seed(), stream, 0);
  return drop_path(x, p, training, default_seed(), keyed->first, keyed->second);
}

// ---------------------------------------------------------------------------------------------------
// Cross-entropy over any leading dims

namespace {

std::string position_text(const Shape& labels, int64_t row) {
  std::vector<int64_t> idx(static_cast<size_t>(labels.ndim()));
  for (int d = labels.ndim() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = labels[d] ? row % labels[d] : 0;
    row = labels[d] ? row / labels[d] : 0;
  }
  std::string s = "(";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + ")";
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const CrossEntropyOptions& o) {
  check_floating("cross_entropy", logits);
  RT_CHECK(labels.defined(), "op 'cross_entropy': undefined labels");
  if (logits.ndim() < 2)
    RT_THROW("op 'cross_entropy': logits must be (N, C) or (N, ..., C) with classes last, got ", logits.describe());
  std::vector<int64_t> lead(logits.shape().begin(), logits.shape().end() - 1);
  const Shape label_shape{std::span<const int64_t>(lead)};
  if (!(labels.shape() == label_shape) || (labels.dtype() != DType::I32 && labels.dtype() != DType::I64))
    RT_THROW("op 'cross_entropy': labels must be i32 or i64 of shape ", label_shape, ", got ", labels.describe(),
             " for logits ", logits.describe());
  if (labels.device() != logits.device())
    RT_THROW("op 'cross_entropy': logits ", logits.describe(), " and labels ", labels.describe(),
             " are on different devices");
  if (!(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0))
    RT_THROW("op 'cross_entropy': label_smoothing must be in [0, 1], got ", o.label_smoothing);
  const int64_t cols = logits.size(-1), rows = logits.numel() / std::max<int64_t>(cols, 1);
  RT_CHECK(rows > 0 && cols > 0, "op 'cross_entropy': empty logits ", logits.describe());
  const DType loss_dtype = logits.dtype() == DType::F64 ? DType::F64 : DType::F32;
  if (o.weight.defined() && (o.weight.ndim() != 1 || o.weight.size(0) != cols || o.weight.dtype() != loss_dtype ||
                             o.weight.device() != logits.device()))
    RT_THROW("op 'cross_entropy': class weights ", o.weight.describe(), " must be ", dtype_name(loss_dtype), "[", cols,
             "] on ", logits.device().str(), " for logits ", logits.describe());
  CrossEntropyArgs args;
  args.smoothing = o.label_smoothing;
  args.has_ignore = o.ignore_index.has_value();
  args.ignore_index = o.ignore_index.value_or(0);
  args.class_weight = o.weight.defined() ? &o.weight : nullptr;
  const bool plain = !args.has_ignore && !args.class_weight;  // the mean over rows, as before either existed
  const Tensor flat = logits.reshape(Shape{rows, cols}), flat_labels = labels.reshape(Shape{rows});
  Tensor log_probs = Tensor::empty(flat.shape(), logits.dtype(), logits.device());
  Tensor row_loss = Tensor::empty(Shape{rows}, loss_dtype, logits.device());
  Tensor row_weight = Tensor::empty(Shape{rows}, loss_dtype, logits.device());
  Tensor bad_row = Tensor::empty(Shape{1}, DType::I64, logits.device());
  RT_KERNEL(logits.device(), "cross_entropy", cross_entropy)
  (flat, flat_labels, args, log_probs, row_loss, row_weight, bad_row);
  detail::after_op(logits.device(), "cross_entropy");
  // On the GPU the flag is read at the next host read of device data (the loss, at a log point), so the
  // step makes no host wait for it; the error still names the label, its position and the logits. The read
  // goes on the stream the kernel ran on (the deferral's), whichever thread's read runs the check.
  const bool deferred = !logits.device().is_cpu();
  auto check = [rows, cols, what = logits.describe(), deferred, label_shape,
                ignore = o.ignore_index](const std::vector<Tensor>& evidence) {
    const int64_t row = evidence[0].to(Device::cpu()).data<int64_t>()[0];
    if (row < 0 || row >= rows) return;
    const auto value = static_cast<long long>(evidence[1].slice(row, row + 1).item());
    RT_THROW("op 'cross_entropy': label ", value, label_shape.ndim() > 1 ? " at position " : " at row ",
             label_shape.ndim() > 1 ? position_text(label_shape, row) : std::to_string(row), " is outside [0, ", cols,
             ")", ignore ? detail::str_cat(" and not the ignore index ", *ignore) : std::string(), " for logits ", what,
             deferred ? " (checked on the device and reported at the next read of the loss; RINGTRAIN_CUDA_SYNC=1 "
                        "reports it at the op)"
                      : "");
  };
  if (deferred)
    defer_device_check({bad_row, flat_labels.detach()}, check);
  else
    check({bad_row, flat_labels.detach()});
  Tensor loss, weight_total;
  {
    NoGradGuard no_grad;
    if (plain) {
      loss = mean(row_loss);
    } else {
      weight_total = sum(row_weight);
      loss = div(sum(row_loss), weight_total);
    }
  }
  if (!needs_grad({&logits})) return loss;
  Tensor saved_log_probs = log_probs, saved_labels = flat_labels.detach(), weight = o.weight;
  const DType logits_dtype = logits.dtype();
  const Shape shape = logits.shape();
  return record(
      "cross_entropy", {&logits}, loss,
      [saved_log_probs, saved_labels, args, weight, weight_total, plain, rows, logits_dtype, shape](const Tensor& g) {
        CrossEntropyArgs a = args;
        a.class_weight = weight.defined() ? &weight : nullptr;
        Tensor dlogits = Tensor::empty(saved_log_probs.shape(), logits_dtype, g.device());
        // Scaled by 1/rows (or 1 for the weighted mean) here, and by the incoming gradient (over the
        // weights' total) on the device: no host wait.
        RT_KERNEL(g.device(), "cross_entropy", cross_entropy_backward)
        (saved_log_probs, saved_labels, a, plain ? 1.0 / static_cast<double>(rows) : 1.0, dlogits);
        detail::after_op(g.device(), "cross_entropy_backward");
        const Tensor factor = plain ? g : div(g, weight_total);
        dlogits = mul(dlogits, factor.to(logits_dtype));
        return Grads{dlogits.reshape(shape)};
      });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing) {
  CrossEntropyOptions o;
  o.label_smoothing = label_smoothing;
  return cross_entropy(logits, labels, o);
}

}  // namespace ringtrain
