// Row-major matrix products on cuBLAS for the linear layers and attention. cuBLAS is column-major: a
// row-major matrix with leading dimension ld is the column-major view of its transpose, so
// C = op(A) . op(B) (row-major) is computed as C^T = op(B)^T . op(A)^T in cuBLAS's terms, i.e. the same
// call with the operands swapped. Accumulation is fp32 for every dtype (CUBLAS_COMPUTE_32F; TF32 tensor
// cores for F32 only when the backend allows them); 16-bit inputs run on the tensor cores. cuBLAS takes
// F32, BF16 or F16 outputs for 16-bit inputs and F32 outputs for F32 inputs; other combinations go
// through an fp32 scratch output and a cast. The linear layers try cuBLASLt first (lt_gemm, with the bias
// fused; cublaslt_matmul.cpp) and come here when it has no algorithm for a problem.
#include <climits>

#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_launch.h"

namespace gpt {

using namespace cuda;

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

}  // namespace

void CudaBackend::gemm(const GemmArgs& g, const char* op) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  require(fits_int(g.m) && fits_int(g.n) && fits_int(g.k) && fits_int(g.lda) && fits_int(g.ldb) && fits_int(g.ldc) &&
              fits_int(g.batch),
          op, "matrix product too large for cuBLAS's 32-bit dimensions (m=" + std::to_string(g.m) +
                  " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + ")");
  const bool supported = g.c_dtype == g.ab || g.c_dtype == DType::F32;
  if (!supported) {
    // Only dense single products need this path (linear layers with mixed dtypes).
    require(g.batch == 1 && g.ldc == g.n, op, "unsupported output dtype for a strided matrix product");
    Tensor scratch = empty({g.m * g.n}, DType::F32);
    if (g.beta != 0.f) cast(g.c, g.c_dtype, scratch.raw(), DType::F32, g.m * g.n, stream_);
    GemmArgs f32 = g;
    f32.c = scratch.raw();
    f32.c_dtype = DType::F32;
    gemm(f32, op);
    cast(scratch.raw(), DType::F32, g.c, g.c_dtype, g.m * g.n, stream_);
    return;
  }
  if (g.k == 0) {
    // An empty sum: C = beta * C; only the two cases the backend uses are needed.
    require(g.beta == 1.f || (g.beta == 0.f && g.batch == 1 && g.ldc == g.n), op, "empty product with general beta");
    if (g.beta == 0.f) {
      check_cuda(cudaMemsetAsync(g.c, 0, g.m * g.n * dtype_size(g.c_dtype), stream_), op, "cudaMemsetAsync");
      sync_check(op, "cudaMemsetAsync (waited for under GPT_CUDA_SYNC_CHECKS)", "memset");
    }
    return;
  }
  const cublasComputeType_t compute =
      g.ab == DType::F32 && allow_tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t ab = cuda_type(g.ab), c = cuda_type(g.c_dtype);
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  cublasStatus_t s;
  if (g.batch == 1) {
    s = cublasGemmEx(cublas_, op_b, op_a, n, m, k, &g.alpha, g.b, ab, static_cast<int>(g.ldb), g.a, ab,
                     static_cast<int>(g.lda), &g.beta, g.c, c, static_cast<int>(g.ldc), compute, CUBLAS_GEMM_DEFAULT);
  } else {
    s = cublasGemmStridedBatchedEx(cublas_, op_b, op_a, n, m, k, &g.alpha, g.b, ab, static_cast<int>(g.ldb),
                                   g.stride_b, g.a, ab, static_cast<int>(g.lda), g.stride_a, &g.beta, g.c, c,
                                   static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.batch), compute,
                                   CUBLAS_GEMM_DEFAULT);
  }
  check_cublas(s, op, g.batch == 1 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx");
  sync_check(op, "the cuBLAS product (waited for under GPT_CUDA_SYNC_CHECKS)", "cuBLAS");
}

bool CudaBackend::lt_gemm(const GemmArgs& g, LtEpilogue epilogue, void* bias, DType bias_dtype, const char* op,
                          void* aux) {
  if (!lt_ || g.batch != 1 || g.alpha != 1.f) return false;
  LtProblem p;
  p.trans_a = g.trans_a, p.trans_b = g.trans_b;
  p.m = g.m, p.n = g.n, p.k = g.k;
  p.a = g.a, p.lda = g.lda;
  p.b = g.b, p.ldb = g.ldb;
  p.c = g.c, p.ldc = g.ldc;
  p.ab = g.ab, p.c_dtype = g.c_dtype;
  p.beta = g.beta;
  p.tf32 = g.ab == DType::F32 && allow_tf32_;
  p.epilogue = epilogue, p.bias = bias, p.bias_dtype = bias_dtype, p.aux = aux;
  const bool ran = lt_->run(p, stream_, op);
  if (ran) sync_check(op, "the cuBLASLt product (waited for under GPT_CUDA_SYNC_CHECKS)", "cuBLASLt");
  return ran;
}

size_t CudaBackend::lt_plans() const { return lt_ ? lt_->plans() : 0; }

}  // namespace gpt
