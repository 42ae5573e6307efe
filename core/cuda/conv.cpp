// core/cuda/conv.cpp: 2-D convolution on the GPU with cuDNN, in ringtrain's layouts (NHWC activations,
// KRSC filters = cuDNN's NHWC filter format), for f32, f16, bf16 (float accumulation) and f64.
//
// Algorithms are chosen once per shape (device, dtype, geometry, math mode) and cached for the process:
// by benchmarking every algorithm that fits the workspace bound (cudnnFind*AlgorithmEx, like PyTorch's
// cudnn.benchmark) unless RINGTRAIN_CUDNN_BENCHMARK=0 asks for cuDNN's heuristic instead. The workspace
// bound is RINGTRAIN_CUDNN_WORKSPACE_MB (default 1024); RINGTRAIN_CUDNN_DETERMINISTIC=1 keeps only
// deterministic algorithms. f32 may use TF32 tensor cores unless set_allow_tf32(false).
//
// f64 runs in NCHW: cuDNN's NHWC kernels are its tensor-core and float ones, and on an H200 (cuDNN 9.14)
// it offered no NHWC double backward-data algorithm at all. So f64 convolutions copy their operands to
// NCHW/KCRS with cudnnTransformTensor, run there and copy the result back; f64 is the reference dtype of
// the gradient checks, where these copies cost nothing that matters.
// The bias gradient is ringtrain's own column reduction (core/cuda/reduce.cu: deterministic, f32
// accumulation for 16-bit types): cudnnConvolutionBackwardBias returns NOT_SUPPORTED for bf16.
// The math type that cuDNN's search reports with an algorithm is set on the descriptor before that
// algorithm runs (as PyTorch does): an algorithm run under another math type than it was timed with may
// be refused with BAD_PARAM.
//
// cuDNN 9 marks this (the "legacy") convolution API deprecated in favour of its graph API; it remains
// supported and is what this file uses, so the deprecation warnings are silenced here only.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_kernels.h"
#include "core/cuda/device_guard.h"
#include "core/device.h"
#include "core/env.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace ringtrain::cuda {
namespace {

cudaStream_t stream_now() { return static_cast<cudaStream_t>(current_stream().handle()); }

// One handle per device per thread (handles must not be shared by threads that set different streams).
cudnnHandle_t cudnn_handle(int device) {
  struct Handles {
    std::vector<cudnnHandle_t> handles;
    ~Handles() {
      for (cudnnHandle_t h : handles)
        if (h) CUDNN_CHECK_NOTHROW(cudnnDestroy(h));
    }
  };
  thread_local Handles t;
  if (device >= static_cast<int>(t.handles.size())) t.handles.resize(static_cast<size_t>(device) + 1, nullptr);
  cudnnHandle_t& h = t.handles[static_cast<size_t>(device)];
  if (!h) CUDNN_CHECK(cudnnCreate(&h));
  CUDNN_CHECK(cudnnSetStream(h, stream_now()));
  return h;
}

cudnnDataType_t cudnn_type(DType t, const char* op) {
  switch (t) {
    case DType::F32:
      return CUDNN_DATA_FLOAT;
    case DType::F16:
      return CUDNN_DATA_HALF;
    case DType::BF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::F64:
      return CUDNN_DATA_DOUBLE;
    default:
      RT_THROW("op '", op, "': cuDNN convolution does not support dtype ", dtype_name(t));
  }
}

int narrow(int64_t v, const char* what) {
  RT_CHECK(v >= 0 && v <= 0x7fffffff, "conv2d on CUDA: ", what, " ", v, " does not fit cuDNN's int");
  return static_cast<int>(v);
}

// RAII descriptors for one call: x (n, c, h, w), w (k, c/groups, r, s), y (n, k, p, q), all NHWC.
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnDataType_t type{};
  bool is_double = false;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NHWC;  // of x, y and w alike; NCHW for f64 (see the top)

  Descriptors(const ConvGeometry& g, DType dtype, const char* op) {
    type = cudnn_type(dtype, op);
    is_double = dtype == DType::F64;
    format = is_double ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, format, type, narrow(g.n, "batch"), narrow(g.c, "channels"),
                                           narrow(g.h, "height"), narrow(g.w, "width")));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, format, type, narrow(g.n, "batch"), narrow(g.k, "filters"),
                                           narrow(g.p, "output height"), narrow(g.q, "output width")));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias, format, type, 1, narrow(g.k, "filters"), 1, 1));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, type, format, narrow(g.k, "filters"),
                                           narrow(g.c / g.groups, "channels per group"), narrow(g.r, "filter height"),
                                           narrow(g.s, "filter width")));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv, narrow(g.pad_h, "padding"), narrow(g.pad_w, "padding"), narrow(g.stride_h, "stride"),
        narrow(g.stride_w, "stride"), narrow(g.dilation_h, "dilation"), narrow(g.dilation_w, "dilation"),
        CUDNN_CROSS_CORRELATION, is_double ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, narrow(g.groups, "groups")));
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math_type(dtype)));
  }
  ~Descriptors() {
    if (conv) CUDNN_CHECK_NOTHROW(cudnnDestroyConvolutionDescriptor(conv));
    if (w) CUDNN_CHECK_NOTHROW(cudnnDestroyFilterDescriptor(w));
    if (bias) CUDNN_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(bias));
    if (y) CUDNN_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(y));
    if (x) CUDNN_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(x));
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  static cudnnMathType_t math_type(DType dtype) {
    if (dtype == DType::F16 || dtype == DType::BF16) return CUDNN_TENSOR_OP_MATH;
    if (dtype == DType::F32) return allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    return CUDNN_DEFAULT_MATH;
  }
  // alpha/beta: double for double data, float otherwise.
  const void* one() const { return is_double ? static_cast<const void*>(&kOneD) : static_cast<const void*>(&kOneF); }
  const void* zero() const { return is_double ? static_cast<const void*>(&kZeroD) : static_cast<const void*>(&kZeroF); }
  static constexpr float kOneF = 1.0f, kZeroF = 0.0f;
  static constexpr double kOneD = 1.0, kZeroD = 0.0;
};

size_t workspace_limit() {
  static const size_t limit = [] {
    const int64_t mb = ringtrain_number("RINGTRAIN_CUDNN_WORKSPACE_MB").value_or(1024);
    return static_cast<size_t>(mb) << 20;
  }();
  return limit;
}

// Cache key: everything the choice depends on.
enum class Pass : int { Forward, BackwardData, BackwardFilter };
using Key = std::tuple<int, int, int, std::vector<int64_t>>;  // pass, device, dtype + math, geometry

Key make_key(Pass pass, int device, DType dtype, const ConvGeometry& g) {
  return {static_cast<int>(pass),
          device,
          static_cast<int>(dtype) * 4 + static_cast<int>(Descriptors::math_type(dtype)),
          {g.n, g.h, g.w, g.c, g.k, g.r, g.s, g.p, g.q, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.dilation_h,
           g.dilation_w, g.groups}};
}

struct Choice {
  int algo = 0;
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;  // the math type cuDNN timed (or ranked) the algorithm with
};

std::mutex g_cache_mutex;
std::map<Key, Choice> g_cache;

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::Forward:
      return "forward";
    case Pass::BackwardData:
      return "backward data";
    case Pass::BackwardFilter:
      return "backward filter";
  }
  return "?";
}

// The fastest successful result (deterministic ones only when asked) within the workspace bound.
template <typename Perf>
Choice pick(const std::vector<Perf>& results, int count, Pass pass, const ConvGeometry& g, DType dtype) {
  // Read once, like the workspace bound: the cache does not key on them.
  static const bool deterministic = ringtrain_switch("RINGTRAIN_CUDNN_DETERMINISTIC");
  for (int i = 0; i < count; ++i) {  // cuDNN returns them sorted by time
    const Perf& r = results[static_cast<size_t>(i)];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > workspace_limit()) continue;
    if (deterministic && r.determinism != CUDNN_DETERMINISTIC) continue;
    return {static_cast<int>(r.algo), r.memory, r.mathType};
  }
  std::string seen;  // what cuDNN did return, for the message
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[static_cast<size_t>(i)];
    seen += detail::str_cat(
        seen.empty() ? "" : ", ", "algo ", static_cast<int>(r.algo), ": ", cudnnGetErrorString(r.status),
        r.status == CUDNN_STATUS_SUCCESS ? detail::str_cat(" needing ", r.memory >> 20, " MiB") : std::string());
  }
  RT_THROW("conv2d on CUDA: cuDNN has no ", dtype_name(dtype), " ", pass_name(pass), " algorithm for N=", g.n,
           " H=", g.h, " W=", g.w, " C=", g.c, " K=", g.k, " R=", g.r, " S=", g.s, " within a ",
           workspace_limit() >> 20, " MiB workspace",
           deterministic ? " that is deterministic (RINGTRAIN_CUDNN_DETERMINISTIC=1)" : "", " (cuDNN offered ",
           count == 0 ? std::string("none") : seen, "); raise RINGTRAIN_CUDNN_WORKSPACE_MB");
}

// What benchmarking may use: the bound, but no more than half of what the device has free now.
size_t find_workspace_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return std::min(workspace_limit(), free_bytes / 2);
}

Tensor workspace_tensor(size_t bytes, Device device) {
  return Tensor::empty(Shape{static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::U8, device);
}

// Looks the choice up, or makes it: `find` benchmarks (writing into the real output buffers, which the
// call then overwrites anyway), `heuristic` asks cuDNN's ranking.
template <typename FindFn, typename HeuristicFn>
Choice choose(const Key& key, FindFn find, HeuristicFn heuristic) {
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    if (auto it = g_cache.find(key); it != g_cache.end()) return it->second;
  }
  static const bool benchmark = ringtrain_switch("RINGTRAIN_CUDNN_BENCHMARK");  // read once (not in the key)
  const Choice c = benchmark ? find() : heuristic();
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_cache.emplace(key, c);
  return c;
}

constexpr int kMaxAlgos = 16;

// The algorithm search of one pass, through choose(): `find(max, &n, results, workspace, bytes)` runs cuDNN's
// benchmark (Find...AlgorithmEx) within the bytes benchmarking may use, `rank(max, &n, results)` cuDNN's
// heuristic (Get...Algorithm_v7); each calls its cuDNN function under CUDNN_CHECK, so an error names it.
template <typename Perf, typename FindFn, typename RankFn>
Choice search(Pass pass, const Key& key, const Tensor& any, const ConvGeometry& g, FindFn find, RankFn rank) {
  return choose(
      key,
      [&] {
        std::vector<Perf> r(kMaxAlgos);
        int n = 0;
        const size_t bytes = find_workspace_bytes();
        Tensor ws = workspace_tensor(bytes, any.device());
        find(kMaxAlgos, &n, r.data(), ws.data_ptr(), bytes);
        return pick(r, n, pass, g, any.dtype());
      },
      [&] {
        std::vector<Perf> r(kMaxAlgos);
        int n = 0;
        rank(kMaxAlgos, &n, r.data());
        return pick(r, n, pass, g, any.dtype());
      });
}

// f64's NCHW copies (see the top). A tensor stored NHWC with logical dims (n, c, h, w) -- filters KRSC as
// (k, c / groups, r, s) -- goes in as an NCHW copy, and an output comes back from one when the pass ends.
// For the other dtypes every pointer is the tensor's own.
class Operands {
 public:
  Operands(cudnnHandle_t h, const Descriptors& d) : h_(h), nchw_(d.format == CUDNN_TENSOR_NCHW) {}
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;

  const void* in(const Tensor& t, std::array<int64_t, 4> dims) {
    if (!nchw_) return t.data_ptr();
    Tensor copy = Tensor::empty(t.shape(), t.dtype(), t.device());
    transform(dims, CUDNN_TENSOR_NHWC, t.data_ptr(), CUDNN_TENSOR_NCHW, copy.data_ptr());
    keep_.push_back(copy);
    return copy.data_ptr();
  }
  void* out(Tensor& t, std::array<int64_t, 4> dims) {
    if (!nchw_) return t.data_ptr();
    RT_CHECK(!out_, "conv2d on CUDA: one output per pass");
    staged_ = Tensor::empty(t.shape(), t.dtype(), t.device());
    out_ = &t;
    out_dims_ = dims;
    return staged_.data_ptr();
  }
  // After the pass: the output back into its NHWC tensor.
  void finish() {
    if (out_) transform(out_dims_, CUDNN_TENSOR_NCHW, staged_.data_ptr(), CUDNN_TENSOR_NHWC, out_->data_ptr());
  }

 private:
  void transform(std::array<int64_t, 4> dims, cudnnTensorFormat_t from, const void* src, cudnnTensorFormat_t to,
                 void* dst) {
    cudnnTensorDescriptor_t a = nullptr, b = nullptr;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&a));
    const auto destroy = [&] {
      if (a) CUDNN_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(a));
      if (b) CUDNN_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(b));
    };
    try {
      CUDNN_CHECK(cudnnCreateTensorDescriptor(&b));
      const int n = narrow(dims[0], "batch"), c = narrow(dims[1], "channels"), hh = narrow(dims[2], "height"),
                w = narrow(dims[3], "width");
      CUDNN_CHECK(cudnnSetTensor4dDescriptor(a, from, CUDNN_DATA_DOUBLE, n, c, hh, w));
      CUDNN_CHECK(cudnnSetTensor4dDescriptor(b, to, CUDNN_DATA_DOUBLE, n, c, hh, w));
      const double one = 1.0, zero = 0.0;
      CUDNN_CHECK(cudnnTransformTensor(h_, &one, a, src, &zero, b, dst));
    } catch (...) {
      destroy();
      throw;
    }
    destroy();
  }

  cudnnHandle_t h_;
  bool nchw_;
  std::vector<Tensor> keep_;  // the input copies, alive until the pass has been queued
  Tensor staged_;
  Tensor* out_ = nullptr;
  std::array<int64_t, 4> out_dims_{};
};

std::array<int64_t, 4> x_dims(const ConvGeometry& g) { return {g.n, g.c, g.h, g.w}; }
std::array<int64_t, 4> y_dims(const ConvGeometry& g) { return {g.n, g.k, g.p, g.q}; }
std::array<int64_t, 4> w_dims(const ConvGeometry& g) { return {g.k, g.c / g.groups, g.r, g.s}; }

// The math type the chosen algorithm was measured with.
void use_math(const Descriptors& d, const Choice& c) { CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math)); }

// The descriptors of one pass over one shape, made once per thread and kept (keyed as the algorithm
// choice is): creating and setting five of them and destroying them again cost every call tens of
// microseconds of host time, about 160 calls a ResNet-50 step. Per thread, because use_math sets the
// convolution descriptor's math type before each call.
const Descriptors& descriptors_for(const Key& key, const ConvGeometry& g, DType dtype, const char* op) {
  thread_local std::map<Key, std::unique_ptr<Descriptors>> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, std::make_unique<Descriptors>(g, dtype, op)).first;
  return *it->second;
}

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvGeometry& g, Tensor& y) {
  DeviceGuard guard(x.device().index);
  const Key key = make_key(Pass::Forward, x.device().index, x.dtype(), g);  // the descriptors' and the choice's
  const Descriptors& d = descriptors_for(key, g, x.dtype(), "conv2d");
  cudnnHandle_t h = cudnn_handle(x.device().index);
  Operands o(h, d);
  const void* xp = o.in(x, x_dims(g));
  const void* wp = o.in(w, w_dims(g));
  void* yp = o.out(y, y_dims(g));
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  const Choice c = search<Perf>(
      Pass::Forward, key, x, g,
      [&](int max, int* n, Perf* r, void* ws, size_t bytes) {
        CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x, xp, d.w, wp, d.conv, d.y, yp, max, n, r, ws, bytes));
      },
      [&](int max, int* n, Perf* r) {
        CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, max, n, r));
      });
  use_math(d, c);
  Tensor ws = workspace_tensor(c.workspace, x.device());
  CUDNN_CHECK(cudnnConvolutionForward(h, d.one(), d.x, xp, d.w, wp, d.conv,
                                      static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws.data_ptr(), c.workspace,
                                      d.zero(), d.y, yp));
  if (bias) CUDNN_CHECK(cudnnAddTensor(h, d.one(), d.bias, bias->data_ptr(), d.one(), d.y, yp));
  o.finish();
}

void conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeometry& g, Tensor& dx) {
  DeviceGuard guard(dy.device().index);
  const Key key = make_key(Pass::BackwardData, dy.device().index, dy.dtype(), g);  // the descriptors' and the choice's
  const Descriptors& d = descriptors_for(key, g, dy.dtype(), "conv2d backward");
  cudnnHandle_t h = cudnn_handle(dy.device().index);
  Operands o(h, d);
  const void* wp = o.in(w, w_dims(g));
  const void* dyp = o.in(dy, y_dims(g));
  void* dxp = o.out(dx, x_dims(g));
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  const Choice c = search<Perf>(
      Pass::BackwardData, key, dy, g,
      [&](int max, int* n, Perf* r, void* ws, size_t bytes) {
        CUDNN_CHECK(
            cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, wp, d.y, dyp, d.conv, d.x, dxp, max, n, r, ws, bytes));
      },
      [&](int max, int* n, Perf* r) {
        CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, max, n, r));
      });
  use_math(d, c);
  Tensor ws = workspace_tensor(c.workspace, dy.device());
  CUDNN_CHECK(cudnnConvolutionBackwardData(h, d.one(), d.w, wp, d.y, dyp, d.conv,
                                           static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws.data_ptr(),
                                           c.workspace, d.zero(), d.x, dxp));
  o.finish();
}

void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw, Tensor* dbias) {
  DeviceGuard guard(x.device().index);
  const Key key = make_key(Pass::BackwardFilter, x.device().index, x.dtype(), g);  // the descriptors' and the choice's
  const Descriptors& d = descriptors_for(key, g, x.dtype(), "conv2d backward");
  cudnnHandle_t h = cudnn_handle(x.device().index);
  Operands o(h, d);
  const void* xp = o.in(x, x_dims(g));
  const void* dyp = o.in(dy, y_dims(g));
  void* dwp = o.out(dw, w_dims(g));
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  const Choice c = search<Perf>(
      Pass::BackwardFilter, key, x, g,
      [&](int max, int* n, Perf* r, void* ws, size_t bytes) {
        CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, xp, d.y, dyp, d.conv, d.w, dwp, max, n, r, ws,
                                                                  bytes));
      },
      [&](int max, int* n, Perf* r) {
        CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, max, n, r));
      });
  use_math(d, c);
  Tensor ws = workspace_tensor(c.workspace, x.device());
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, d.one(), d.x, xp, d.y, dyp, d.conv,
                                             static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws.data_ptr(),
                                             c.workspace, d.zero(), d.w, dwp));
  o.finish();
  // dy is (N*P*Q, K) rows in NHWC: the bias gradient sums its columns (see the top).
  if (dbias) reduce(ReduceOp::Sum, dy, 1, g.n * g.p * g.q, g.k, *dbias, nullptr);
}

}  // namespace

void register_conv_kernels(KernelTable& t) {
  t.conv2d_forward = &conv2d_forward;
  t.conv2d_backward_data = &conv2d_backward_data;
  t.conv2d_backward_weights = &conv2d_backward_weights;
}

}  // namespace ringtrain::cuda

namespace ringtrain {

std::vector<std::string> cuda_conv_algorithms() {
  using namespace cuda;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  std::vector<std::string> out;
  for (const auto& [key, choice] : g_cache) {
    const auto& geo = std::get<3>(key);
    std::string line = std::string(pass_name(static_cast<Pass>(std::get<0>(key)))) +
                       " cuda:" + std::to_string(std::get<1>(key)) + " N" + std::to_string(geo[0]) + " H" +
                       std::to_string(geo[1]) + " W" + std::to_string(geo[2]) + " C" + std::to_string(geo[3]) + " K" +
                       std::to_string(geo[4]) + " " + std::to_string(geo[5]) + "x" + std::to_string(geo[6]) +
                       " stride " + std::to_string(geo[9]) + " groups " + std::to_string(geo[15]) + ": algo " +
                       std::to_string(choice.algo) + ", workspace " + std::to_string(choice.workspace) + " B";
    out.push_back(line);
  }
  return out;
}

}  // namespace ringtrain
