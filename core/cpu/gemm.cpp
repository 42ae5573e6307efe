// core/cpu/gemm.cpp: the CPU GEMM. f32 runs oneDNN's matmul, on the same OpenMP threads as the convolutions and
// every other kernel: OpenBLAS's own pthreads, woken while OpenMP's threads still spin after a kernel, fought them
// for the cores (ConvNeXt-Tiny's step on 2 threads: 1.4 s through OpenBLAS, 0.6 s through oneDNN; 1.1 s on one
// thread either way). bf16 runs oneDNN's bf16 matmul (bf16 operands, f32 accumulation) where the CPU has bf16
// kernels (cpu_bf16_kernels(), core/cpu_features.h); elsewhere, and for f16, the operands convert to f32. OpenBLAS
// keeps f64 (gradient checks) and any shape for which oneDNN has only its reference loops.
#include <cblas.h>
#include <omp.h>

#include <array>
#include <bit>
#include <cstdint>
#include <dnnl.hpp>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace ringtrain::cpu {
namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// One bf16 matmul: C (batch, m, n; row stride ldc) = alpha * op(A) op(B) + beta * C, each operand a
// strided view of ringtrain's row-major buffers (a zero batch stride broadcasts it), built once per shape,
// alpha, beta and thread count.
struct MatmulPlan {
  dnnl::matmul prim;
  std::string kernel;            // oneDNN's name for the implementation
  bool reference = false;        // oneDNN offered only its reference loops: the caller goes through f32
  int64_t scratchpad_bytes = 0;  // the primitive's workspace, a tensor of each execution (as conv.cpp's)
  memory::desc a, b, c;
};

// op(X) of (rows, cols), stored row-major with leading dimension ld, or transposed.
memory::desc view(int64_t batch, int64_t rows, int64_t cols, int64_t batch_stride, bool trans, int64_t ld, dt type) {
  const int64_t b = batch_stride == 0 ? 1 : batch;
  const int64_t bs = batch_stride == 0 ? rows * cols : batch_stride;
  return memory::desc({b, rows, cols}, type, trans ? memory::dims{bs, 1, ld} : memory::dims{bs, ld, 1});
}

MatmulPlan build_matmul(const GemmArgs& g, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c,
                        dt type) {
  MatmulPlan plan;
  plan.a = view(batch, g.m, g.k, stride_a, g.trans_a, g.lda, type);
  plan.b = view(batch, g.k, g.n, stride_b, g.trans_b, g.ldb, type);
  plan.c = memory::desc({batch, g.m, g.n}, type, memory::dims{batch == 1 ? g.m * g.ldc : stride_c, g.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.alpha != 1.0) attr.set_output_scales(0, {static_cast<float>(g.alpha)});
  if (g.beta != 0.0) {
    dnnl::post_ops ops;
    ops.append_sum(static_cast<float>(g.beta));
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(plan.a, plan.b, plan.c), attr, engine());
  plan.kernel = pd.impl_info_str();
  plan.reference = plan.kernel.rfind("ref", 0) == 0;
  plan.scratchpad_bytes = static_cast<int64_t>(pd.scratchpad_desc().get_size());
  plan.prim = dnnl::matmul(pd);
  return plan;
}

PlanCache<std::array<int64_t, 17>, MatmulPlan> matmul_plans;

std::shared_ptr<const MatmulPlan> matmul_plan(const GemmArgs& g, int64_t batch, int64_t stride_a, int64_t stride_b,
                                              int64_t stride_c, dt type) {
  const std::array<int64_t, 17> key{g.trans_a,
                                    g.trans_b,
                                    g.m,
                                    g.n,
                                    g.k,
                                    g.lda,
                                    g.ldb,
                                    g.ldc,
                                    batch,
                                    stride_a,
                                    stride_b,
                                    stride_c,
                                    std::bit_cast<int64_t>(g.alpha),
                                    std::bit_cast<int64_t>(g.beta),
                                    omp_get_max_threads(),
                                    static_cast<int64_t>(cpu_bf16_kernels()),
                                    static_cast<int64_t>(type)};
  return matmul_plans.get(key, [&] { return build_matmul(g, batch, stride_a, stride_b, stride_c, type); });
}

// Runs the GEMM on oneDNN's matmul (bf16 or f32 operands, f32 accumulation) when oneDNN has more than its
// reference loops for the shape; false: the caller takes OpenBLAS.
bool onednn_matmul(const GemmArgs& g, const Tensor& a, const Tensor& b, Tensor& c, int64_t batch, int64_t stride_a,
                   int64_t stride_b, int64_t stride_c) {
  const auto plan = matmul_plan(g, batch, stride_a, stride_b, stride_c, a.dtype() == DType::BF16 ? dt::bf16 : dt::f32);
  if (plan->reference) return false;
  thread_local dnnl::stream stream(engine());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(plan->a, engine(), a.data_ptr())},
                                       {DNNL_ARG_WEIGHTS, memory(plan->b, engine(), b.data_ptr())},
                                       {DNNL_ARG_DST, memory(plan->c, engine(), c.data_ptr())}};
  Tensor workspace;
  if (plan->scratchpad_bytes > 0) {
    workspace = Tensor::empty(Shape{(plan->scratchpad_bytes + 3) / 4});
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(memory::desc({plan->scratchpad_bytes}, dt::u8, memory::format_tag::x),
                                             engine(), workspace.data_ptr()));
  }
  plan->prim.execute(stream, args);
  stream.wait();
  return true;
}

void gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, Tensor& c, int64_t batch, int64_t stride_a,
          int64_t stride_b, int64_t stride_c) {
  const CBLAS_TRANSPOSE ta = g.trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = g.trans_b ? CblasTrans : CblasNoTrans;
  const blasint m = static_cast<blasint>(g.m), n = static_cast<blasint>(g.n), k = static_cast<blasint>(g.k);
  const blasint lda = static_cast<blasint>(g.lda), ldb = static_cast<blasint>(g.ldb), ldc = static_cast<blasint>(g.ldc);
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    // An empty inner dimension: BLAS may not touch C; make C = beta * C (all batches) explicit.
    if (g.beta == 0.0)
      fill(c, 0.0);
    else
      scalar(ScalarOp::Mul, c, g.beta, c);
    return;
  }
  switch (a.dtype()) {
    case DType::F32:
      if (onednn_matmul(g, a, b, c, batch, stride_a, stride_b, stride_c)) return;
      for (int64_t bi = 0; bi < batch; ++bi)
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(g.alpha), a.data<float>() + bi * stride_a, lda,
                    b.data<float>() + bi * stride_b, ldb, static_cast<float>(g.beta), c.data<float>() + bi * stride_c,
                    ldc);
      return;
    case DType::F64:
      for (int64_t bi = 0; bi < batch; ++bi)
        cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, g.alpha, a.data<double>() + bi * stride_a, lda,
                    b.data<double>() + bi * stride_b, ldb, g.beta, c.data<double>() + bi * stride_c, ldc);
      return;
    case DType::BF16:
      if (cpu_bf16_kernels() != Bf16Kernels::F32 && onednn_matmul(g, a, b, c, batch, stride_a, stride_b, stride_c))
        return;
      [[fallthrough]];
    case DType::F16: {
      Tensor a32 = Tensor::empty(a.shape(), DType::F32), b32 = Tensor::empty(b.shape(), DType::F32);
      Tensor c32 = Tensor::empty(c.shape(), DType::F32);
      convert(a, a32);
      convert(b, b32);
      if (g.beta != 0.0) convert(c, c32);
      gemm(g, a32, b32, c32, batch, stride_a, stride_b, stride_c);  // the f32 path
      convert(c32, c);
      return;
    }
    default:
      RT_THROW("op 'matmul' has no CPU kernel for dtype ", dtype_name(a.dtype()));
  }
}

}  // namespace

void register_gemm_kernels(KernelTable& t) { t.gemm = &gemm; }

void release_matmul_plans() { matmul_plans.clear(); }

}  // namespace ringtrain::cpu

namespace ringtrain {

std::string cpu_gemm_kernel(DType dtype, int64_t m, int64_t n, int64_t k) {
  RT_CHECK(m > 0 && n > 0 && k > 0, "cpu_gemm_kernel: m, n, k must be positive, got ", m, ", ", n, ", ", k);
  if (dtype == DType::F64) return "openblas";
  RT_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16, "cpu_gemm_kernel: ", dtype_name(dtype),
           " has no CPU GEMM");
  GemmArgs g;
  g.m = m, g.n = n, g.k = k, g.lda = k, g.ldb = n, g.ldc = n;
  const bool bf16 = dtype == DType::BF16 && cpu_bf16_kernels() != Bf16Kernels::F32;
  const auto plan =
      cpu::matmul_plan(g, 1, 0, 0, 0, bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32);
  const std::string through = dtype == DType::F32 || bf16 ? "" : " (through f32)";
  return (plan->reference ? "openblas" : "onednn " + plan->kernel) + through;
}

}  // namespace ringtrain
