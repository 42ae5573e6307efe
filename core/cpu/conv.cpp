// core/cpu/conv.cpp: 2-D convolution on the CPU. f32 runs on oneDNN with NHWC activations and KRSC
// ("ohwi", grouped "gohwi") filters, the layouts ringtrain keeps everywhere (reordered only around the
// Winograd layers and for oneDNN's filter layouts); bf16 runs oneDNN's bf16 kernels on the same layouts
// where the CPU has them (cpu_bf16_kernels(), core/cpu_features.h), else converts to f32 around the f32
// ones, as f16 always does; f64 (gradient checks, references) runs direct loops.
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <dnnl.hpp>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/env.h"
#include "core/ops.h"
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

// t: every operand's type (f32, or bf16 on the bf16 kernels: activations, filters, bias and their
// gradients all bf16, accumulated in f32 inside oneDNN).
ConvDescs make_descs(const ConvGeometry& g, bool with_bias, dt t) {
  ConvDescs d;
  d.src = memory::desc({g.n, g.c, g.h, g.w}, t, tag::nhwc);
  d.dst = memory::desc({g.n, g.k, g.p, g.q}, t, tag::nhwc);
  if (g.groups == 1) {
    d.weights = memory::desc({g.k, g.c, g.r, g.s}, t, tag::ohwi);
    d.weights_any = memory::desc({g.k, g.c, g.r, g.s}, t, tag::any);
  } else {
    d.weights = memory::desc({g.groups, g.k / g.groups, g.c / g.groups, g.r, g.s}, t, tag::gohwi);
    d.weights_any = memory::desc({g.groups, g.k / g.groups, g.c / g.groups, g.r, g.s}, t, tag::any);
  }
  if (with_bias) d.bias = memory::desc({g.k}, t, tag::x);
  d.strides = {g.stride_h, g.stride_w};
  d.dilates = {g.dilation_h - 1, g.dilation_w - 1};  // oneDNN counts dilation from 0
  d.pad_l = {g.pad_h, g.pad_w};
  // Right padding so that the output size is exactly (p, q).
  d.pad_r = {(g.p - 1) * g.stride_h + (g.r - 1) * g.dilation_h + 1 - g.h - g.pad_h,
             (g.q - 1) * g.stride_w + (g.s - 1) * g.dilation_w + 1 - g.w - g.pad_w};
  return d;
}

// ---- Plans: the oneDNN primitives of one geometry, built once
//
// Building a primitive descriptor walks oneDNN's implementation list (about 8 us a call here, 0.5% of a
// ResNet-20 batch-32 step), so each (geometry, pass, thread count, choice) keeps its primitive and the
// reorders around it. Under CpuConvolution::Auto, 3x3 stride-1 layers of at least 32 input and output
// channels (multiples of 16) and 8x8 outputs run Winograd F(4x4, 3x3) where oneDNN has it (AVX-512), on
// nChw16c copies of the NHWC activations (docs/PERFORMANCE.md has the measurements).

enum class Pass { Forward, BackwardData, BackwardWeights };

// Input and output channels. Winograd's gain per byte copied to nChw16c and back grows with the channels:
// at 64 it won at every batch; at 32 only while the copies stay in the L2 cache (ResNet-20 batch 32, 1 MB
// tensors: won; batch 128, 4 MB: lost to the copies), so 32 to 63 channels also need the input to fit
// in half the L2.
constexpr int64_t kWinogradMinChannels = 32, kWinogradAlwaysChannels = 64;

int64_t l2_bytes() {
  static const int64_t bytes = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? static_cast<int64_t>(v) : int64_t{1} << 20;  // unknown: 1 MiB, the smallest AVX-512 L2
  }();
  return bytes;
}
// Output height and width: below 8x8 the 4x4 tiles are mostly padding, and Winograd's coarser rounding
// (its error grows with input perturbations more than direct convolution's) buys nothing.
constexpr int64_t kWinogradMinSide = 8;

// One argument of a primitive: ringtrain's layout and the one the primitive takes, with the reorder
// between them (user -> used for inputs, used -> user for outputs; none when they are the same). NHWC
// activations <-> nChw16c go through blocks16 (below), everything else (filters) through oneDNN.
struct Operand {
  int arg = 0;
  bool output = false;
  memory::desc user, used;
  dnnl::primitive convert;
  int64_t blocked_n = 0, blocked_hw = 0, blocked_c = 0;  // set: NHWC <-> nChw16c of this shape
};

// NHWC <-> nChw16c for C a multiple of 16: every pixel's channels move as whole 16-float blocks, a copy
// bound by memory (oneDNN's generic reorder took twice as long on these shapes). Exact.
RT_MULTIVERSION void blocks16_range(const float* nhwc, float* blocked, int64_t i0, int64_t i1, int64_t hw, int64_t c,
                                    bool to_blocked) {
  const int64_t cb = c / 16;
  for (int64_t i = i0; i < i1; ++i) {  // i = image * cb + block
    const int64_t image = i / cb, block = i % cb;
    const float* a = nhwc + image * hw * c + block * 16;
    float* b = blocked + i * hw * 16;
    if (to_blocked) {
      for (int64_t p = 0; p < hw; ++p)
        for (int64_t l = 0; l < 16; ++l) b[p * 16 + l] = a[p * c + l];
    } else {
      float* out = const_cast<float*>(a);
      for (int64_t p = 0; p < hw; ++p)
        for (int64_t l = 0; l < 16; ++l) out[p * c + l] = b[p * 16 + l];
    }
  }
}

void blocks16(const Operand& o, float* nhwc, float* blocked, bool to_blocked) {
  const int64_t items = o.blocked_n * (o.blocked_c / 16);
  parallel_for(
      items, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, o.blocked_hw * 16)),
      [&](int64_t lo, int64_t hi) { blocks16_range(nhwc, blocked, lo, hi, o.blocked_hw, o.blocked_c, to_blocked); });
}

struct PassPlan {
  dnnl::primitive prim;
  std::vector<Operand> operands;
  int64_t scratchpad_bytes = 0;  // the primitive's own workspace, a tensor of each execution
  std::string kernel;            // oneDNN's name for the implementation ("brgconv:avx512_core_bf16")
  bool reference = false;        // oneDNN offered only its reference loops (bf16 plans then go through f32)
};

std::atomic<int>& convolution_choice() {
  static std::atomic<int> choice = [] {
    const std::string v = env_text("RINGTRAIN_CPU_CONV").value_or("");
    if (v.empty() || v == "auto") return static_cast<int>(CpuConvolution::Auto);
    if (v == "direct") return static_cast<int>(CpuConvolution::Direct);
    RT_THROW("RINGTRAIN_CPU_CONV='", v,
             "' is not a CPU convolution choice: use auto (Winograd where it is faster) or direct");
  }();
  return choice;
}

// The shapes where oneDNN's Winograd beat its direct kernels with the copies to nChw16c and back included
// (ResNet-20's 3x3 layers at batch 32 and 128: it lost at 16 channels; 32 and 64 as above).
bool winograd_candidate(const ConvGeometry& g, CpuConvolution choice) {
  return choice == CpuConvolution::Auto && g.groups == 1 && g.r == 3 && g.s == 3 && g.stride_h == 1 &&
         g.stride_w == 1 && g.dilation_h == 1 && g.dilation_w == 1 && g.pad_h <= 1 && g.pad_w <= 1 && g.c % 16 == 0 &&
         g.k % 16 == 0 && g.c >= kWinogradMinChannels && g.k >= kWinogradMinChannels &&
         (std::min(g.c, g.k) >= kWinogradAlwaysChannels || g.n * g.h * g.w * g.c * 4 <= l2_bytes() / 2) &&
         g.p == g.h + 2 * g.pad_h - 2 && g.q == g.w + 2 * g.pad_w - 2 && g.p >= kWinogradMinSide &&
         g.q >= kWinogradMinSide;
}

dnnl::primitive reorder_between(const memory::desc& from, const memory::desc& to) {
  return dnnl::reorder(dnnl::reorder::primitive_desc(engine(), from, engine(), to));
}

Operand operand(int arg, bool output, const memory::desc& user, const memory::desc& used) {
  Operand o{arg, output, user, used, {}};
  if (user == used) return o;
  const memory::dims dims = user.dims();
  if (dims.size() == 4 && dims[1] % 16 == 0 && user == memory::desc(dims, dt::f32, tag::nhwc) &&
      used == memory::desc(dims, dt::f32, tag::nChw16c)) {
    o.blocked_n = dims[0], o.blocked_c = dims[1], o.blocked_hw = dims[2] * dims[3];
    return o;
  }
  o.convert = output ? reorder_between(used, user) : reorder_between(user, used);
  return o;
}

// The three passes' primitive descriptors for one algorithm and activation layout (src, dst); throws
// dnnl::error when oneDNN has no implementation.
struct PassDescs {
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights;
};

PassDescs pass_descs(const ConvDescs& d, dnnl::algorithm alg, const memory::desc& src, const memory::desc& dst,
                     Pass pass) {
  const bool bias = d.bias.get_size() > 0;
  // The workspaces come from ringtrain's allocator, one per execution: oneDNN's own (a per-thread buffer
  // that only grows) would hold the largest a run ever needed outside the allocator's accounting, which
  // the memory plan (runtime/memory/memory_plan.h) measures.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  PassDescs p;
  p.fwd = bias ? dnnl::convolution_forward::primitive_desc(
                     dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src, d.weights_any, d.bias,
                                                     dst, d.strides, d.dilates, d.pad_l, d.pad_r),
                     attr, engine())
               : dnnl::convolution_forward::primitive_desc(
                     dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src, d.weights_any, dst,
                                                     d.strides, d.dilates, d.pad_l, d.pad_r),
                     attr, engine());
  if (pass == Pass::BackwardData) {
    p.bwd_data = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(alg, src, d.weights_any, dst, d.strides, d.dilates, d.pad_l, d.pad_r),
        attr, engine(), p.fwd);
  }
  if (pass == Pass::BackwardWeights) {
    p.bwd_weights = dnnl::convolution_backward_weights::primitive_desc(
        bias ? dnnl::convolution_backward_weights::desc(alg, src, d.weights_any, d.bias, dst, d.strides, d.dilates,
                                                        d.pad_l, d.pad_r)
             : dnnl::convolution_backward_weights::desc(alg, src, d.weights_any, dst, d.strides, d.dilates, d.pad_l,
                                                        d.pad_r),
        attr, engine(), p.fwd);
  }
  return p;
}

// On an AMX CPU the avx512_bf16 path caps oneDNN's ISA for the process (oneDNN chooses AMX wherever it
// may); oneDNN accepts the cap only before its first JIT kernel.
void cap_isa_for(Bf16Kernels path) {
  static const bool capped = [&] {
    if (path != Bf16Kernels::Avx512Bf16 || !cpu_features().amx_bf16) return false;
    try {
      dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16);
    } catch (const dnnl::error&) {
      RT_THROW(
          "the avx512_bf16 path on an AMX CPU must be chosen before the first oneDNN kernel runs: set "
          "RINGTRAIN_CPU_BF16=avx512_bf16 in the environment");
    }
    return true;
  }();
  RT_CHECK(capped || path != Bf16Kernels::Avx512Bf16 || !cpu_features().amx_bf16,
           "the avx512_bf16 path on an AMX CPU must be chosen before the first oneDNN kernel runs: set "
           "RINGTRAIN_CPU_BF16=avx512_bf16 in the environment");
  RT_CHECK(!capped || path != Bf16Kernels::Amx,
           "the amx path cannot follow avx512_bf16 in one process: oneDNN's ISA is capped at avx512_core_bf16");
}

const char* impl_name(const PassDescs& p, Pass pass) {
  switch (pass) {
    case Pass::BackwardData:
      return p.bwd_data.impl_info_str();
    case Pass::BackwardWeights:
      return p.bwd_weights.impl_info_str();
    case Pass::Forward:
      break;
  }
  return p.fwd.impl_info_str();
}

PassPlan build_plan(const ConvGeometry& g, bool bias, Pass pass, CpuConvolution choice, Bf16Kernels bf16) {
  if (bf16 != Bf16Kernels::F32) cap_isa_for(bf16);
  const ConvDescs d = make_descs(g, bias, bf16 != Bf16Kernels::F32 ? dt::bf16 : dt::f32);
  PassDescs p;
  memory::desc src = d.src, dst = d.dst;
  bool winograd = false;
  // oneDNN 2.6 has Winograd for f32 only; bf16 runs its direct kernels.
  if (bf16 == Bf16Kernels::F32 && winograd_candidate(g, choice)) {
    const memory::desc bsrc({g.n, g.c, g.h, g.w}, dt::f32, tag::nChw16c),
        bdst({g.n, g.k, g.p, g.q}, dt::f32, tag::nChw16c);
    try {
      p = pass_descs(d, dnnl::algorithm::convolution_winograd, bsrc, bdst, pass);
      src = bsrc, dst = bdst, winograd = true;
    } catch (const dnnl::error&) {  // no Winograd on this CPU (oneDNN has it for AVX-512 only): direct
    }
  }
  if (!winograd) p = pass_descs(d, dnnl::algorithm::convolution_direct, src, dst, pass);
  PassPlan plan;
  plan.kernel = impl_name(p, pass);
  plan.reference = plan.kernel.rfind("ref", 0) == 0;
  if (plan.reference && bf16 != Bf16Kernels::F32) return plan;  // the caller goes through f32 instead
  switch (pass) {
    case Pass::Forward:
      plan.prim = dnnl::convolution_forward(p.fwd);
      plan.scratchpad_bytes = static_cast<int64_t>(p.fwd.scratchpad_desc().get_size());
      plan.operands = {operand(DNNL_ARG_SRC, false, d.src, src),
                       operand(DNNL_ARG_WEIGHTS, false, d.weights, p.fwd.weights_desc()),
                       operand(DNNL_ARG_DST, true, d.dst, dst)};
      if (bias) plan.operands.push_back(operand(DNNL_ARG_BIAS, false, d.bias, p.fwd.bias_desc()));
      break;
    case Pass::BackwardData:
      plan.prim = dnnl::convolution_backward_data(p.bwd_data);
      plan.scratchpad_bytes = static_cast<int64_t>(p.bwd_data.scratchpad_desc().get_size());
      plan.operands = {operand(DNNL_ARG_DIFF_DST, false, d.dst, dst),
                       operand(DNNL_ARG_WEIGHTS, false, d.weights, p.bwd_data.weights_desc()),
                       operand(DNNL_ARG_DIFF_SRC, true, d.src, src)};
      break;
    case Pass::BackwardWeights:
      plan.prim = dnnl::convolution_backward_weights(p.bwd_weights);
      plan.scratchpad_bytes = static_cast<int64_t>(p.bwd_weights.scratchpad_desc().get_size());
      plan.operands = {operand(DNNL_ARG_SRC, false, d.src, src), operand(DNNL_ARG_DIFF_DST, false, d.dst, dst),
                       operand(DNNL_ARG_DIFF_WEIGHTS, true, d.weights, p.bwd_weights.diff_weights_desc())};
      if (bias) plan.operands.push_back(operand(DNNL_ARG_DIFF_BIAS, true, d.bias, p.bwd_weights.diff_bias_desc()));
      break;
  }
  return plan;
}

// Plans by (geometry, bias, pass, oneDNN thread count: a primitive is built for the threads it will
// run on, the convolution choice, bf16: the bf16 kernels' path, F32 for f32 plans).
PlanCache<std::array<int64_t, 21>, PassPlan> conv_plans;

std::shared_ptr<const PassPlan> plan_for(const ConvGeometry& g, bool bias, Pass pass, Bf16Kernels bf16) {
  const CpuConvolution choice = cpu_convolution();
  const std::array<int64_t, 21> key{g.n,
                                    g.h,
                                    g.w,
                                    g.c,
                                    g.k,
                                    g.r,
                                    g.s,
                                    g.p,
                                    g.q,
                                    g.stride_h,
                                    g.stride_w,
                                    g.pad_h,
                                    g.pad_w,
                                    g.dilation_h,
                                    g.dilation_w,
                                    g.groups,
                                    bias,
                                    static_cast<int64_t>(pass),
                                    omp_get_max_threads(),
                                    static_cast<int64_t>(choice),
                                    static_cast<int64_t>(bf16)};
  return conv_plans.get(key, [&] { return build_plan(g, bias, pass, choice, bf16); });
}

// Runs a plan on ringtrain-layout buffers (one per operand, in the plan's order), reordering through
// scratch tensors where the primitive takes another layout.
void execute(const PassPlan& plan, const std::vector<void*>& buffers) {
  thread_local dnnl::stream stream(engine());  // one per calling thread (a stream is not shared across threads)
  std::unordered_map<int, memory> args;
  std::vector<Tensor> scratch;
  std::vector<std::pair<const Operand*, memory>> outputs;
  for (size_t i = 0; i < plan.operands.size(); ++i) {
    const Operand& o = plan.operands[i];
    memory user(o.user, engine(), buffers[i]);
    if (!o.convert && o.blocked_n == 0) {
      args.emplace(o.arg, user);
      continue;
    }
    scratch.push_back(Tensor::empty(Shape{static_cast<int64_t>((o.used.get_size() + 3) / 4)}));
    memory used(o.used, engine(), scratch.back().data_ptr());
    if (o.output) {
      outputs.emplace_back(&o, user);
    } else if (o.blocked_n > 0) {
      blocks16(o, static_cast<float*>(buffers[i]), static_cast<float*>(used.get_data_handle()), true);
    } else {
      o.convert.execute(stream, {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, used}});
    }
    args.emplace(o.arg, used);
  }
  Tensor workspace;
  if (plan.scratchpad_bytes > 0) {
    workspace = Tensor::empty(Shape{(plan.scratchpad_bytes + 3) / 4});
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 memory(memory::desc({plan.scratchpad_bytes}, dt::u8, tag::x), engine(), workspace.data_ptr()));
  }
  plan.prim.execute(stream, args);
  stream.wait();
  for (auto& [o, user] : outputs) {
    memory& used = args.at(o->arg);
    if (o->blocked_n > 0) {
      blocks16(*o, static_cast<float*>(user.get_data_handle()), static_cast<float*>(used.get_data_handle()), false);
    } else {
      o->convert.execute(stream, {{DNNL_ARG_FROM, used}, {DNNL_ARG_TO, user}});
    }
  }
  stream.wait();
}

void* ptr(const Tensor& t) { return t.data_ptr(); }

// t in dtype: t itself when it is already, else a converted copy.
Tensor as_type(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.detach().to(dtype); }
// Where a kernel writes out: out itself when it has the kernel's dtype, else a scratch tensor copied back.
Tensor output_in(const Tensor& out, DType dtype) {
  return out.dtype() == dtype ? out : Tensor::empty(out.shape(), dtype);
}
void copy_back(const Tensor& computed, Tensor& out) {
  if (computed.data_ptr() != out.data_ptr()) out.copy_(computed);
}

// The plan and kernel dtype for 16/32-bit operands: bf16 on the bf16 kernels where this CPU has them and
// oneDNN has more than its reference loops for the shape, f32 otherwise.
struct Chosen {
  std::shared_ptr<const PassPlan> plan;
  DType dtype = DType::F32;
};
Chosen choose(const ConvGeometry& g, bool bias, Pass pass, DType data) {
  const Bf16Kernels bf16 = cpu_bf16_kernels();
  if (data == DType::BF16 && bf16 != Bf16Kernels::F32) {
    auto plan = plan_for(g, bias, pass, bf16);
    if (!plan->reference) return {std::move(plan), DType::BF16};
  }
  return {plan_for(g, bias, pass, Bf16Kernels::F32), DType::F32};
}

// ---- f64 reference: direct loops (small shapes: gradient checks and oneDNN cross-checks)

struct Index {
  const ConvGeometry& g;
  int64_t x(int64_t n, int64_t h, int64_t w, int64_t c) const { return ((n * g.h + h) * g.w + w) * g.c + c; }
  int64_t y(int64_t n, int64_t p, int64_t q, int64_t k) const { return ((n * g.p + p) * g.q + q) * g.k + k; }
  int64_t f(int64_t k, int64_t r, int64_t s, int64_t c) const {
    return ((k * g.r + r) * g.s + s) * (g.c / g.groups) + c;
  }
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
  if (is_floating(t.dtype())) return;
  RT_THROW("op '", op, "' has no CPU kernel for dtype ", dtype_name(t.dtype()));
}

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvGeometry& g, Tensor& y) {
  check_dtype(x, "conv2d");
  if (x.dtype() == DType::F64) return reference_forward(x, w, bias, g, y);
  const Chosen c = choose(g, bias != nullptr, Pass::Forward, x.dtype());
  Tensor xc = as_type(x, c.dtype), wc = as_type(w, c.dtype), yc = output_in(y, c.dtype);
  Tensor bc = bias ? as_type(*bias, c.dtype) : Tensor();
  std::vector<void*> buffers{ptr(xc), ptr(wc), ptr(yc)};
  if (bias) buffers.push_back(ptr(bc));
  execute(*c.plan, buffers);
  copy_back(yc, y);
}

void conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeometry& g, Tensor& dx) {
  check_dtype(dy, "conv2d_backward");
  if (dy.dtype() == DType::F64) return reference_backward_data(dy, w, g, dx);
  const Chosen c = choose(g, false, Pass::BackwardData, dy.dtype());
  Tensor dyc = as_type(dy, c.dtype), wc = as_type(w, c.dtype), dxc = output_in(dx, c.dtype);
  execute(*c.plan, {ptr(dyc), ptr(wc), ptr(dxc)});
  copy_back(dxc, dx);
}

void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw, Tensor* dbias) {
  check_dtype(x, "conv2d_backward");
  if (x.dtype() == DType::F64) return reference_backward_weights(x, dy, g, dw, dbias);
  const Chosen c = choose(g, dbias != nullptr, Pass::BackwardWeights, x.dtype());
  Tensor xc = as_type(x, c.dtype), dyc = as_type(dy, c.dtype), dwc = output_in(dw, c.dtype);
  Tensor dbc = dbias ? output_in(*dbias, c.dtype) : Tensor();
  std::vector<void*> buffers{ptr(xc), ptr(dyc), ptr(dwc)};
  if (dbias) buffers.push_back(ptr(dbc));
  execute(*c.plan, buffers);
  copy_back(dwc, dw);
  if (dbias) copy_back(dbc, *dbias);
}

}  // namespace

void set_onednn_threads(int n) { omp_set_num_threads(n); }

void release_conv_plans() {
  conv_plans.clear();
  // oneDNN's own cache of primitives by descriptor: emptied by a capacity of 0, then given its size back.
  const int capacity = dnnl::get_primitive_cache_capacity();
  dnnl::set_primitive_cache_capacity(0);
  dnnl::set_primitive_cache_capacity(capacity);
}

}  // namespace ringtrain::cpu

namespace ringtrain {

void set_cpu_convolution(CpuConvolution choice) { cpu::convolution_choice().store(static_cast<int>(choice)); }
CpuConvolution cpu_convolution() { return static_cast<CpuConvolution>(cpu::convolution_choice().load()); }

std::string cpu_convolution_kernel(const ConvGeometry& g, DType dtype, bool bias, int pass) {
  RT_CHECK(pass >= 0 && pass <= 2, "cpu_convolution_kernel: pass ", pass,
           " is none of 0 (forward), 1 (backward data), 2 (backward weights)");
  RT_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
           "cpu_convolution_kernel: ", dtype_name(dtype), " convolutions do not run on oneDNN");
  return cpu::choose(g, bias, static_cast<cpu::Pass>(pass), dtype).plan->kernel;
}

}  // namespace ringtrain

namespace ringtrain::cpu {

void register_conv_kernels(KernelTable& t) {
  t.conv2d_forward = &conv2d_forward;
  t.conv2d_backward_data = &conv2d_backward_data;
  t.conv2d_backward_weights = &conv2d_backward_weights;
}

}  // namespace ringtrain::cpu
