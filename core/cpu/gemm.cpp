// core/cpu/gemm.cpp: the CPU GEMM on OpenBLAS (f32, f64); f16 and bf16 convert to f32 around it.
#include <cblas.h>

#include <cstdint>

#include "core/check.h"
#include "core/cpu/cpu_kernels.h"
#include "core/kernels.h"

namespace ringtrain::cpu {
namespace {

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
    case DType::F16:
    case DType::BF16: {
      Tensor a32 = Tensor::empty(a.shape(), DType::F32), b32 = Tensor::empty(b.shape(), DType::F32);
      Tensor c32 = Tensor::empty(c.shape(), DType::F32);
      convert(a, a32);
      convert(b, b32);
      if (g.beta != 0.0) convert(c, c32);
      for (int64_t bi = 0; bi < batch; ++bi)
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(g.alpha), a32.data<float>() + bi * stride_a, lda,
                    b32.data<float>() + bi * stride_b, ldb, static_cast<float>(g.beta),
                    c32.data<float>() + bi * stride_c, ldc);
      convert(c32, c);
      return;
    }
    default:
      RT_THROW("op 'matmul' has no CPU kernel for dtype ", dtype_name(a.dtype()));
  }
}

}  // namespace

void register_gemm_kernels(KernelTable& t) { t.gemm = &gemm; }

}  // namespace ringtrain::cpu
