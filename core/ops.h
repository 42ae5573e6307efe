// core/ops.h: every tensor op, declared once. Each op checks its inputs (errors name the op, shapes,
// dtypes and devices), dispatches to the kernel table of the inputs' device (core/kernels.h; a missing
// kernel is an error naming the op and device, never a silent CPU fallback), and, when an input requires
// grad, records its backward closure (core/autograd.h) written next to the forward in core/ops.cpp.
//
// Binary ops need inputs of one dtype and one device (convert explicitly with .to()); shapes broadcast
// NumPy-style. Comparisons return U8 0/1 tensors and are not differentiable.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ringtrain {

struct ConvGeometry;  // core/kernels.h

// ---- elementwise, broadcasting
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

// ---- with a scalar
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor rsub(const Tensor& a, double s);  // s - a
Tensor rdiv(const Tensor& a, double s);  // s / a
Tensor pow(const Tensor& a, double exponent);

// ---- unary
Tensor neg(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);

// ---- reductions (over all elements -> shape [], or over `dim`)
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);
Tensor max(const Tensor& x);
Tensor max(const Tensor& x, int dim, bool keepdim = false);     // gradient goes to the first maximum
Tensor argmax(const Tensor& x, int dim, bool keepdim = false);  // I64
// Sums `x` down to `shape` (the inverse of broadcasting; used by backward of broadcasting ops).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra
// a: (..., M, K) with any leading dims (batched when b is also 3-D with the same batch), b: (K, N) or
// (B, K, N) -> (..., M, N). f32 may use TF32 tensor cores on GPU (set_allow_tf32).
Tensor matmul(const Tensor& a, const Tensor& b);
// x: (..., in), weight: (out, in) [PyTorch layout], bias: (out) or undefined -> (..., out).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
void set_allow_tf32(bool allow);
bool allow_tf32();

// ---- convolution (NHWC activations, KRSC filters)
struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};
// x: (N, H, W, C), weight: (K, R, S, C / groups), bias: (K) or undefined -> (N, P, Q, K).
// CPU: oneDNN for f32 and bf16 (bf16 kernels where the CPU has them, core/cpu_features.h; else, and for
// f16, through f32), a direct reference loop for f64.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params);
// How f32 convolutions run on the CPU. Auto: Winograd F(4x4, 3x3) for 3x3 stride-1 layers with at least
// 32 input and output channels (multiples of 16) and outputs of at least 8x8, where oneDNN has it
// (AVX-512), direct kernels otherwise;
// Direct: oneDNN's direct kernels only (the rounding of releases before Winograd). The default is read
// once from RINGTRAIN_CPU_CONV (auto or direct; anything else is an error), else Auto. Winograd rounds
// differently from direct convolution, at the float-noise level.
enum class CpuConvolution { Auto, Direct };
void set_cpu_convolution(CpuConvolution choice);
CpuConvolution cpu_convolution();
// oneDNN's name for the kernel a CPU convolution of this geometry runs for dtype (f32, bf16, f16) and pass
// (0 forward, 1 backward data, 2 backward weights), e.g. "brgconv:avx512_core_bf16": what the bf16 path
// (core/cpu_features.h) and the Winograd choice really gave.
std::string cpu_convolution_kernel(const ConvGeometry& g, DType dtype, bool bias, int pass);
// The CPU GEMM a (m, k) x (k, n) product of dtype runs: "onednn " and oneDNN's kernel name (f32, and bf16 on
// the bf16 kernels), the same plus " (through f32)" (f16, and bf16 on the f32 path), or "openblas" (f64, and
// shapes oneDNN has only reference loops for).
std::string cpu_gemm_kernel(DType dtype, int64_t m, int64_t n, int64_t k);

// ---- normalisation and pooling (NHWC)
// Batch norm over every dim but the last (channels). weight, bias, running_mean, running_var: (C), f32
// (f64 for f64 x) — the fp32 master copies under mixed precision. In training the batch statistics are
// used and the running ones updated in place (momentum as in PyTorch, unbiased variance); in eval the
// running statistics are used. fuse_relu applies ReLU to the output in the same pass; a defined
// `residual` (x's shape) is added before it: relu(bn(x) + residual), the end of a residual block.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps, bool fuse_relu = false,
                  const Tensor& residual = Tensor());

// What a synchronised batch norm exchanges with the other replicas of a data-parallel job (comm/ makes one
// over a communicator). Both are collective: every replica calls them in the same order.
class BatchNormExchange {
 public:
  virtual ~BatchNormExchange() = default;
  // Every replica's `local` (1-D, the same size everywhere), concatenated in replica order.
  virtual Tensor all_gather(const Tensor& local) = 0;
  // `t` summed over the replicas, in place, the same bits on every replica.
  virtual void all_reduce_sum(Tensor& t) = 0;
};

// SyncBatchNorm in training: batch_norm with the statistics of every replica's batch, as one process with
// their union would compute them. Each replica takes its per-channel (count, mean, M2) in two f64 passes,
// one all-gather brings them together and Chan's parallel formula merges them in replica order (exact,
// and identical on every replica, whatever the means); the normalisation is the fused batch-norm pass
// (with the residual add and ReLU). Backward: the per-channel sums of dy and dy * xhat are summed over
// the replicas with one all-reduce for dx; the weight and bias gradients are this replica's own (the
// gradient averaging of data parallelism completes them).
Tensor sync_batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, double momentum, double eps, bool fuse_relu, const Tensor& residual,
                       const std::shared_ptr<BatchNormExchange>& exchange);
// Batch statistics kept for a recompute (layers/recompute.h). A forward run again from the same input
// computes the same statistics, so its second run takes them from the first: while a tape records on this
// thread, each training-mode batch_norm / sync_batch_norm of a CPU tensor appends the statistics it
// normalised with; while one replays, each takes the next entry instead of reducing its input again
// (SyncBN: instead of exchanging with the other replicas as well) and leaves the running statistics alone,
// which the first run moved. The output and the saved statistics are the same bits either way (the same
// normalisation pass over the same numbers). Scopes nest: the innermost replaying one feeds a call, and
// every recording one in scope records it.
class BatchNormTape {
 public:
  struct Entry {
    Tensor mean, invstd;  // (C), the parameter dtype
    double count = 0;     // SyncBN: the values per channel over every replica; 0 for plain batch norm
  };
  enum class Mode { kRecord, kReplay };
  class Scope {
   public:
    Scope(BatchNormTape& tape, Mode mode);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    friend class BatchNormTape;
    BatchNormTape& tape_;
    Mode mode_;
    Scope* outer_;
  };
  size_t size() const { return entries_.size(); }
  // Entries taken since a replaying scope last opened on this tape (each opening starts at the first).
  size_t replayed() const { return next_; }

  // For batch_norm and sync_batch_norm: the entry to replay for input x (C channels, `sync`: SyncBN's)
  // when a replaying scope is open, else nothing; an entry of another kind or width is an error naming op.
  static std::optional<Entry> replay(const char* op, const Tensor& x, bool sync);
  // Appends e to every recording scope's tape.
  static void record(const Tensor& x, const Entry& e);

 private:
  std::vector<Entry> entries_;
  size_t next_ = 0;
};

struct Pool2dParams {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
};
// x: (N, H, W, C) -> (N, P, Q, C). Max: gradient to the first maximum of each window.
Tensor max_pool2d(const Tensor& x, const Pool2dParams& params);
// Average over the window including padding (PyTorch's count_include_pad=True).
Tensor avg_pool2d(const Tensor& x, const Pool2dParams& params);
// (N, H, W, C) -> (N, C), the mean over H and W.
Tensor global_avg_pool(const Tensor& x);

// ---- softmax family (over the last dim)
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
// Mean over rows of softmax cross-entropy with label smoothing. logits: (N, C) floating; labels: (N) I32/I64
// in [0, C). Returns a scalar (F32 for 16-bit logits).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing = 0.0);

// ---- regularisation
// Zeroes elements with probability p and scales the rest by 1/(1-p). The mask depends only on
// (seed, stream, first + element index), identical on CPU and GPU. Identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, uint64_t seed, uint64_t stream, int64_t first = 0);
// The same, drawing (seed, stream) from the default generator (manual_seed to reproduce); while the runtime's
// per-sample keying is set (sample_draws below), sample n of x (N, ...) is drawn as sample first_sample + n of
// the step's global batch, as drop_path draws: the masks do not depend on the world size or the micro-batches.
Tensor dropout(const Tensor& x, double p, bool training = true);

// ---------------------------------------------------------------------------------------------------
// The pieces of today's CNNs (core/ops_tensor.cpp, core/ops_nn.cpp). PyTorch's torch.nn.functional is the
// reference: the same semantics, the same defaults, errors naming the op and the shapes.

// ---- moving elements. ringtrain tensors are always contiguous, so these copy (PyTorch would make strided
// views), except narrow and select on the first dim, which are views sharing the input's memory.
// cat: tensors of one dtype and device whose shapes agree but along `dim` (negative counts from the end).
Tensor cat(const std::vector<Tensor>& tensors, int dim);
// Pieces of `size` along dim, the last one smaller when the dim does not divide (torch.split).
std::vector<Tensor> split(const Tensor& x, int64_t size, int dim);
// Pieces of the given sizes, which must add up to the dim (torch.split with a list).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim);
// `chunks` pieces of ceil(size / chunks), fewer when that already covers the dim (torch.chunk).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int dim);
// Elements [start, start + length) of dim (start may be negative: from the end).
Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length);
// Index `index` of dim, the dim removed (negative: from the end).
Tensor select(const Tensor& x, int dim, int64_t index);
// Dims reordered: output dim i is input dim dims[i] (a permutation of 0..ndim-1, negative allowed).
Tensor permute(const Tensor& x, const std::vector<int>& dims);
Tensor transpose(const Tensor& x, int dim0, int dim1);
// x itself: every ringtrain tensor is already contiguous (for code ported from PyTorch).
Tensor contiguous(const Tensor& x);
// x broadcast to `shape` (NumPy rules: x's dims align to the right and must be 1 or equal), a copy.
Tensor expand(const Tensor& x, const Shape& shape);
// cond (U8, nonzero = true) ? a : b, elementwise with broadcasting of all three; a and b of one dtype and
// device. Differentiable in a and b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// ---- activations (floating; each with a fused backward kernel)
// min(max(x, min), max), either bound optional (not both absent); gradient where min < x < max (PyTorch 2's:
// none at a bound itself).
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
// clamp to [min, max] with PyTorch's hardtanh gradient: zero at the bounds themselves.
Tensor hardtanh(const Tensor& x, double min = -1.0, double max = 1.0);
Tensor relu6(const Tensor& x);                            // hardtanh(x, 0, 6)
Tensor leaky_relu(const Tensor& x, double slope = 0.01);  // x > 0 ? x : slope * x
enum class GeluApproximation : uint8_t { None, Tanh };    // PyTorch's approximate="none" | "tanh"
Tensor gelu(const Tensor& x, GeluApproximation approximation = GeluApproximation::None);
Tensor silu(const Tensor& x);         // x * sigmoid(x)
Tensor hardswish(const Tensor& x);    // x * relu6(x + 3) / 6
Tensor hardsigmoid(const Tensor& x);  // relu6(x + 3) / 6

// ---- normalisation over channels (NHWC: C is the last dim). weight and bias: (C) F32 (F64 for f64 x), or
// both undefined (no affine); statistics in f32 or better for 16-bit x; one fused kernel each way.
// Over the last dim of x (..., C), each position on its own (ConvNeXt's channels-last LayerNorm on NHWC).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// x (N, ..., C): C in `groups` groups, each (sample, group) normalised over its positions and channels.
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// ---- pooling and resizing (NHWC)
// x (N, H, W, C) -> (N, out_h, out_w, C): output (i, j) averages rows [floor(i H / out_h), ceil((i + 1) H /
// out_h)) and the columns likewise (torch's adaptive_avg_pool2d); any output size, also larger than H x W.
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);
enum class UpsampleMode : uint8_t { Nearest, NearestExact, Bilinear };
struct UpsampleOptions {
  int64_t out_h = 0, out_w = 0;         // the output size; or 0 and a scale factor
  double scale_h = 0.0, scale_w = 0.0;  // output = floor(input * scale); the source index uses 1 / scale
  UpsampleMode mode = UpsampleMode::Nearest;
  bool align_corners = false;  // bilinear only (PyTorch refuses it for nearest)
};
// x (N, H, W, C) -> (N, out_h, out_w, C), as torch.nn.functional.interpolate.
Tensor upsample(const Tensor& x, const UpsampleOptions& options);
struct ConvTranspose2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t output_pad_h = 0, output_pad_w = 0;  // each smaller than its stride or its dilation
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};
// The gradient of conv2d with respect to its input, as a layer: x (N, H, W, Cin), weight (Cin, R, S,
// Cout / groups) -- PyTorch's (Cin, Cout / groups, R, S) in ringtrain's KRSC order -- bias (Cout) or undefined
// -> (N, (H - 1) stride - 2 pad + dilation (R - 1) + output_pad + 1, ..., Cout). Autocast as conv2d.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvTranspose2dParams& params);

// ---- regularisation
// Stochastic depth per sample (torchvision's StochasticDepth, mode "row"): in training each sample of x (N,
// ...) is kept with probability 1 - p and scaled by 1 / (1 - p), else zeroed; sample i's draw is
// philox_uniform(seed, stream, first_sample + i). Identity when !training or p == 0; p == 1 zeroes all.
Tensor drop_path(const Tensor& x, double p, bool training, uint64_t seed, uint64_t stream, int64_t first_sample);
// The same from the default generator: one stream a call, keyed as sample_draws() says (below).
Tensor drop_path(const Tensor& x, double p, bool training = true);

// Per-sample draws that do not depend on how a global batch is split over ranks and micro-batches. While set,
// drop_path and dropout key sample i of a micro-batch by first_sample + i (its index in the step's global batch)
// and their stream by (step, the draw's place in the model's forward: the default generator's stream minus
// micro_origin, the stream where this micro-batch's forward of the whole model began). The runtime sets it
// before each micro-batch's forward and its recompute (runtime/loop/trainer.cpp, runtime/pipeline/); unset,
// they key by the stream they draw and the element's index in x.
struct SampleDraws {
  bool set = false;
  uint64_t step = 0;
  int64_t first_sample = 0;
  uint64_t micro_origin = 0;
};
void set_sample_draws(const SampleDraws& draws);
SampleDraws sample_draws();
// Under the keying: the keyed stream of a draw that took `stream` from the default generator, and the first
// sample's place in the global batch; nothing when unset.
std::optional<std::pair<uint64_t, int64_t>> keyed_draw(uint64_t stream);

// ---- losses
struct CrossEntropyOptions {
  double label_smoothing = 0.0;
  std::optional<int64_t> ignore_index =
      std::nullopt;          // labels equal to it count for nothing (PyTorch's default -100: set it)
  Tensor weight = Tensor();  // (C) per-class weights in the loss dtype, or undefined
};
// Softmax cross-entropy over the last dim of logits (..., C) -- (N, C) classification or (N, H, W, C)
// per-pixel segmentation -- with labels (...) I32/I64 in [0, C) or the ignore index. The mean over the rows,
// weighted as PyTorch's mean reduction: sum of the rows' losses / sum of their label weights (a batch whose
// every label is ignored gives NaN, as PyTorch). Label smoothing as the (N, C) form.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const CrossEntropyOptions& options);

// The default generator: one per process, shared by every thread (core/process_state.cpp): a seed and a counter
// of consumed streams.
void manual_seed(uint64_t seed);
uint64_t default_seed();
uint64_t next_rng_stream();
// The counter itself (the stream the next draw takes), for checkpoints: restoring it after rebuilding a
// model from the same seed continues the same sequence of dropout masks.
uint64_t rng_stream();
void set_rng_stream(uint64_t stream);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(double s, const Tensor& a) { return rsub(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator/(double s, const Tensor& a) { return rdiv(a, s); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace ringtrain
