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
// The CPU GEMM a (m, k) x (k, n) product of dtype runs: "openblas", "openblas (through f32)" (f16, and bf16
// on the f32 path), or "onednn " and oneDNN's kernel name (bf16 on the bf16 kernels).
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
// Batch statistics kept for a recompute (layers/checkpoint.h). A forward run again from the same input
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
// (seed, stream, element index), identical on CPU and GPU. Identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, uint64_t seed, uint64_t stream);
// The same, drawing (seed, stream) from the thread's default generator (manual_seed to reproduce).
Tensor dropout(const Tensor& x, double p, bool training = true);

// Default generator: a seed and a counter of consumed streams.
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
