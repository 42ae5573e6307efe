// core/cpu/conv.cpp: 2-D convolution on the CPU. f32 runs on oneDNN with NHWC activations and KRSC
// ("ohwi", grouped "gohwi") filters, the layouts ringtrain keeps everywhere, so no reorders; f16/bf16
// convert to f32 around it; f64 (gradient checks, references) runs direct loops.
#include <omp.h>

#include <dnnl.hpp>
#include <mutex>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/parallel.h"

namespace ringtrain::cpu {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Descriptors shared by forward and both backward passes. `weights` is ringtrain's KRSC layout;
// `weights_any` lets oneDNN pick its own (its JIT kernels do not take ohwi directly; the reference
// kernel that does is ~1000x slower), and weights are reordered to and from it (they are small).
struct ConvDescs {
  memory::desc src, weights, weights_any, bias, dst;
  memory::dims strides, dilates, pad_l, pad_r;
};

ConvDescs make_descs(const ConvGeometry& g, bool with_bias) {
  ConvDescs d;
  d.src = memory::desc({g.n, g.c, g.h, g.w}, dt::f32, tag::nhwc);
  d.dst = memory::desc({g.n, g.k, g.p, g.q}, dt::f32, tag::nhwc);
  if (g.groups == 1) {
    d.weights = memory::desc({g.k, g.c, g.r, g.s}, dt::f32, tag::ohwi);
    d.weights_any = memory::desc({g.k, g.c, g.r, g.s}, dt::f32, tag::any);
  } else {
    d.weights = memory::desc({g.groups, g.k / g.groups, g.c / g.groups, g.r, g.s}, dt::f32, tag::gohwi);
    d.weights_any = memory::desc({g.groups, g.k / g.groups, g.c / g.groups, g.r, g.s}, dt::f32, tag::any);
  }
  if (with_bias) d.bias = memory::desc({g.k}, dt::f32, tag::x);
  d.strides = {g.stride_h, g.stride_w};
  d.dilates = {g.dilation_h - 1, g.dilation_w - 1};  // oneDNN counts dilation from 0
  d.pad_l = {g.pad_h, g.pad_w};
  // Right padding so that the output size is exactly (p, q).
  d.pad_r = {(g.p - 1) * g.stride_h + (g.r - 1) * g.dilation_h + 1 - g.h - g.pad_h,
             (g.q - 1) * g.stride_w + (g.s - 1) * g.dilation_w + 1 - g.w - g.pad_w};
  return d;
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvDescs& d) {
  if (d.bias.get_size() > 0) {
    return {dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                            d.src, d.weights_any, d.bias, d.dst, d.strides, d.dilates, d.pad_l,
                                            d.pad_r),
            engine()};
  }
  return {dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                          d.src, d.weights_any, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r),
          engine()};
}

void* ptr(const Tensor& t) { return t.data_ptr(); }

// 16-bit tensors go through f32 copies; f32 tensors are used in place.
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::F32 ? t : t.detach().to(DType::F32); }

void run(dnnl::primitive prim, const std::unordered_map<int, memory>& args) {
  dnnl::stream stream(engine());
  prim.execute(stream, args);
  stream.wait();
}

// `user` (ringtrain layout) as memory in layout `wanted`, reordering into a new buffer if they differ.
memory in_layout(const memory& user, const memory::desc& wanted) {
  if (user.get_desc() == wanted) return user;
  memory converted(wanted, engine());
  dnnl::stream stream(engine());
  dnnl::reorder(user, converted).execute(stream, const_cast<memory&>(user), converted);
  stream.wait();
  return converted;
}

// Copies `produced` (oneDNN's layout) into `user` (ringtrain layout) if they are different buffers.
void back_to_user(const memory& produced, memory& user) {
  if (produced.get_data_handle() == user.get_data_handle()) return;
  dnnl::stream stream(engine());
  dnnl::reorder(produced, user).execute(stream, const_cast<memory&>(produced), user);
  stream.wait();
}

// ---- f64 reference: direct loops (small shapes: gradient checks and oneDNN cross-checks)

struct Index {
  const ConvGeometry& g;
  int64_t x(int64_t n, int64_t h, int64_t w, int64_t c) const { return ((n * g.h + h) * g.w + w) * g.c + c; }
  int64_t y(int64_t n, int64_t p, int64_t q, int64_t k) const { return ((n * g.p + p) * g.q + q) * g.k + k; }
  int64_t f(int64_t k, int64_t r, int64_t s, int64_t c) const { return ((k * g.r + r) * g.s + s) * (g.c / g.groups) + c; }
};

// Calls fn(h, w, r, s, c_in_group, c_global) for every input tap of output (p, q, k).
template <typename Fn>
void for_each_tap(const ConvGeometry& g, int64_t p, int64_t q, int64_t k, Fn&& fn) {
  const int64_t cg = g.c / g.groups, kg = g.k / g.groups, group = k / kg;
  for (int64_t r = 0; r < g.r; ++r) {
    const int64_t h = p * g.stride_h - g.pad_h + r * g.dilation_h;
    if (h < 0 || h >= g.h) continue;
    for (int64_t s = 0; s < g.s; ++s) {
      const int64_t w = q * g.stride_w - g.pad_w + s * g.dilation_w;
      if (w < 0 || w >= g.w) continue;
      for (int64_t c = 0; c < cg; ++c) fn(h, w, r, s, c, group * cg + c);
    }
  }
}

void reference_forward(const Tensor& x, const Tensor& wt, const Tensor* bias, const ConvGeometry& g, Tensor& y) {
  const double *px = x.data<double>(), *pw = wt.data<double>(), *pb = bias ? bias->data<double>() : nullptr;
  double* py = y.data<double>();
  Index ix{g};
  parallel_for(g.n * g.p, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t np = lo; np < hi; ++np) {
      const int64_t n = np / g.p, p = np % g.p;
      for (int64_t q = 0; q < g.q; ++q)
        for (int64_t k = 0; k < g.k; ++k) {
          double acc = pb ? pb[k] : 0.0;
          for_each_tap(g, p, q, k, [&](int64_t h, int64_t w, int64_t r, int64_t s, int64_t c, int64_t cglob) {
            acc += px[ix.x(n, h, w, cglob)] * pw[ix.f(k, r, s, c)];
          });
          py[ix.y(n, p, q, k)] = acc;
        }
    }
  });
}

void reference_backward_data(const Tensor& dy, const Tensor& wt, const ConvGeometry& g, Tensor& dx) {
  const double *pdy = dy.data<double>(), *pw = wt.data<double>();
  double* pdx = dx.data<double>();
  std::fill(pdx, pdx + dx.numel(), 0.0);
  Index ix{g};
  // Serial over n would be slow but scatter-free per image: parallel over images.
  parallel_for(g.n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n)
      for (int64_t p = 0; p < g.p; ++p)
        for (int64_t q = 0; q < g.q; ++q)
          for (int64_t k = 0; k < g.k; ++k) {
            const double gy = pdy[ix.y(n, p, q, k)];
            for_each_tap(g, p, q, k, [&](int64_t h, int64_t w, int64_t r, int64_t s, int64_t c, int64_t cglob) {
              pdx[ix.x(n, h, w, cglob)] += gy * pw[ix.f(k, r, s, c)];
            });
          }
  });
}

void reference_backward_weights(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw, Tensor* db) {
  const double *px = x.data<double>(), *pdy = dy.data<double>();
  double* pdw = dw.data<double>();
  std::fill(pdw, pdw + dw.numel(), 0.0);
  double* pdb = db ? db->data<double>() : nullptr;
  if (pdb) std::fill(pdb, pdb + g.k, 0.0);
  Index ix{g};
  // Parallel over output channels: each k owns its filter slice.
  parallel_for(g.k, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k)
      for (int64_t n = 0; n < g.n; ++n)
        for (int64_t p = 0; p < g.p; ++p)
          for (int64_t q = 0; q < g.q; ++q) {
            const double gy = pdy[ix.y(n, p, q, k)];
            if (pdb) pdb[k] += gy;
            for_each_tap(g, p, q, k, [&](int64_t h, int64_t w, int64_t r, int64_t s, int64_t c, int64_t cglob) {
              pdw[ix.f(k, r, s, c)] += gy * px[ix.x(n, h, w, cglob)];
            });
          }
  });
}

void check_dtype(const Tensor& t, const char* op) {
  if (t.dtype() == DType::F32 || t.dtype() == DType::F64 || t.dtype() == DType::F16 || t.dtype() == DType::BF16) return;
  RT_THROW("op '", op, "' has no CPU kernel for dtype ", dtype_name(t.dtype()));
}

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvGeometry& g, Tensor& y) {
  check_dtype(x, "conv2d");
  if (x.dtype() == DType::F64) return reference_forward(x, w, bias, g, y);
  ConvDescs d = make_descs(g, bias != nullptr);
  auto pd = forward_pd(d);
  Tensor x32 = as_f32(x), w32 = as_f32(w), y32 = y.dtype() == DType::F32 ? y : Tensor::empty(y.shape());
  Tensor b32 = bias ? as_f32(*bias) : Tensor();
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(d.src, engine(), ptr(x32))},
      {DNNL_ARG_WEIGHTS, in_layout(memory(d.weights, engine(), ptr(w32)), pd.weights_desc())},
      {DNNL_ARG_DST, memory(d.dst, engine(), ptr(y32))}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(d.bias, engine(), ptr(b32)));
  run(dnnl::convolution_forward(pd), args);
  if (y32.data_ptr() != y.data_ptr()) y.copy_(y32);
}

void conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeometry& g, Tensor& dx) {
  check_dtype(dy, "conv2d_backward");
  if (dy.dtype() == DType::F64) return reference_backward_data(dy, w, g, dx);
  ConvDescs d = make_descs(g, false);
  auto hint = forward_pd(d);
  dnnl::convolution_backward_data::primitive_desc pd(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, d.src, d.weights_any, d.dst,
                                            d.strides, d.dilates, d.pad_l, d.pad_r),
      engine(), hint);
  Tensor dy32 = as_f32(dy), w32 = as_f32(w), dx32 = dx.dtype() == DType::F32 ? dx : Tensor::empty(dx.shape());
  run(dnnl::convolution_backward_data(pd), {{DNNL_ARG_DIFF_DST, memory(d.dst, engine(), ptr(dy32))},
                                            {DNNL_ARG_WEIGHTS, in_layout(memory(d.weights, engine(), ptr(w32)),
                                                                         pd.weights_desc())},
                                            {DNNL_ARG_DIFF_SRC, memory(d.src, engine(), ptr(dx32))}});
  if (dx32.data_ptr() != dx.data_ptr()) dx.copy_(dx32);
}

void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw, Tensor* dbias) {
  check_dtype(x, "conv2d_backward");
  if (x.dtype() == DType::F64) return reference_backward_weights(x, dy, g, dw, dbias);
  ConvDescs d = make_descs(g, dbias != nullptr);
  auto hint = forward_pd(d);
  auto desc = dbias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src,
                                                               d.weights_any, d.bias, d.dst, d.strides, d.dilates,
                                                               d.pad_l, d.pad_r)
                    : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src,
                                                               d.weights_any, d.dst, d.strides, d.dilates, d.pad_l,
                                                               d.pad_r);
  dnnl::convolution_backward_weights::primitive_desc pd(desc, engine(), hint);
  Tensor x32 = as_f32(x), dy32 = as_f32(dy), dw32 = dw.dtype() == DType::F32 ? dw : Tensor::empty(dw.shape());
  Tensor db32 = dbias ? (dbias->dtype() == DType::F32 ? *dbias : Tensor::empty(dbias->shape())) : Tensor();
  memory user_dw(d.weights, engine(), ptr(dw32));
  memory produced_dw = pd.diff_weights_desc() == d.weights ? user_dw : memory(pd.diff_weights_desc(), engine());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(d.src, engine(), ptr(x32))},
                                       {DNNL_ARG_DIFF_DST, memory(d.dst, engine(), ptr(dy32))},
                                       {DNNL_ARG_DIFF_WEIGHTS, produced_dw}};
  if (dbias) args.emplace(DNNL_ARG_DIFF_BIAS, memory(d.bias, engine(), ptr(db32)));
  run(dnnl::convolution_backward_weights(pd), args);
  back_to_user(produced_dw, user_dw);
  if (dw32.data_ptr() != dw.data_ptr()) dw.copy_(dw32);
  if (dbias && db32.data_ptr() != dbias->data_ptr()) dbias->copy_(db32);
}

}  // namespace

void set_onednn_threads(int n) { omp_set_num_threads(n); }

void register_conv_kernels(KernelTable& t) {
  t.conv2d_forward = &conv2d_forward;
  t.conv2d_backward_data = &conv2d_backward_data;
  t.conv2d_backward_weights = &conv2d_backward_weights;
}

}  // namespace ringtrain::cpu
