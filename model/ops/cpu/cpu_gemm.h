// The CPU backend's own AVX-512 matrix products for the linear layers, C (fp32) = alpha * op(A) . op(B) +
// beta * C, in two input precisions sharing one packed-GEMM structure (cpu_gemm.cpp):
//  - bf16 inputs on AVX512-BF16 (vdpbf16ps: two bf16 products summed into each fp32 lane). Products of
//    bf16 values are exact in fp32 and every sum is an fp32 sum, so the result matches an fp32 GEMM of the
//    same (bf16-valued) inputs up to summation order; the instruction flushes denormal inputs and outputs
//    to zero, as bf16 GEMMs on other hardware do. OpenBLAS 0.3.21 has no bf16 GEMM at all.
//  - fp32 inputs on AVX-512F FMAs. OpenBLAS 0.3.21 does not recognise newer CPUs (Zen 4/5 among them)
//    and runs its AVX2 kernels there at half the rate the cores can do.
// Each C element is summed in the same order (K ascending) however the product is blocked or split over
// threads, so results do not depend on the thread count or on which rows a rank holds.
// Used where the CPU has the instructions and GPT_CPU_GEMM is not "openblas"; callers fall back to
// OpenBLAS sgemm otherwise (bf16 through fp32 copies).
#pragma once
#include <cstdint>

namespace gpt::cpu {

// True when this CPU runs the fp32 product (AVX-512F) and GPT_CPU_GEMM is not "openblas".
bool f32_gemm_available();
// True when this CPU runs the bf16 product (AVX-512F + AVX512-BF16) and GPT_CPU_GEMM is not "openblas".
bool bf16_gemm_available();

// Row-major C[M,N] = alpha * op(A)[M,K] . op(B)[K,N] + beta * C on the calling thread. op(A) = A^T when
// trans_a (A stored [K,M]); likewise B. beta = 0 overwrites C without reading it. bf16 operands are raw
// bf16 bits.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The same products split over the OpenMP threads along the larger of M and N (as parallel_sgemm).
void parallel_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                        int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);
void parallel_gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                       int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace gpt::cpu
