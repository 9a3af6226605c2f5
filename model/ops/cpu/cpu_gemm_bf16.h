// The CPU backend's bf16 matrix product: C (fp32) = alpha * op(A) . op(B) + beta * C with A and B held as
// bf16 bits, on the AVX512-BF16 dot-product instruction (vdpbf16ps: two bf16 products summed into each
// fp32 lane). Products of bf16 values are exact in fp32 and every sum is an fp32 sum, so the result
// matches an fp32 GEMM of the same (bf16-valued) inputs up to summation order; the instruction flushes
// denormal inputs and outputs to zero, as bf16 GEMMs on other hardware do. OpenBLAS 0.3.21 has no bf16
// GEMM, so without this the backend converts to fp32 and runs sgemm at a quarter of the rate.
// Used only where the CPU has AVX512-BF16 and GPT_CPU_BF16_GEMM is not 0; callers fall back to sgemm.
#pragma once
#include <cstdint>

namespace gpt::cpu {

// True when this CPU executes the bf16 product (AVX512F + AVX512-BF16) and the environment does not
// switch it off (GPT_CPU_BF16_GEMM=0, for comparisons).
bool bf16_gemm_available();

// Row-major C[M,N] = alpha * op(A)[M,K] . op(B)[K,N] + beta * C on the calling thread. op(A) = A^T when
// trans_a (A stored [K,M]); likewise B. beta = 0 overwrites C without reading it.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The same product split over the OpenMP threads along the larger of M and N (as parallel_sgemm).
void parallel_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                        int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace gpt::cpu
