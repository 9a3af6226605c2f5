// Every matrix product of the CPU backend, on oneDNN's matmul primitive: the linear layers forward and
// backward (the LM head among them) and the attention products. oneDNN picks the kernel for the CPU it
// runs on at run time (AMX, AVX512-BF16, AVX-512, AVX2, ...), so one binary is fast on any x86-64.
// Products take fp32 or bf16 operands, always accumulate in fp32 and write fp32 or bf16 (rounded once):
// C = alpha * op(A) . op(B) (+ bias broadcast over rows) (+ beta * C). Primitives are created once per shape, dtype, transpose,
// leading dimensions and epilogue, and cached, so a training step creates none after its first.
// A bf16 product that this oneDNN cannot run on this CPU (AVX2 and older) runs on fp32 copies of its
// operands.
#pragma once
#include <cstdint>
#include <string>

namespace gpt::cpu {

enum class MatType { F32, BF16 };

struct MatmulShape {
  bool trans_a = false, trans_b = false;  // op(A) = A^T (A stored [K, M]); likewise B
  int64_t M = 0, N = 0, K = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // row-major leading dimensions as stored
  MatType a = MatType::F32, b = MatType::F32;
  MatType c = MatType::F32;  // bf16: written rounded, so a bf16 activation needs no fp32 copy
  float alpha = 1.f;  // not combined with a bias; with bf16 operands oneDNN 2.6 applies it in a slow scalar
                      // loop after the kernel, so hot small products leave scaling to their callers
  float beta = 0.f;   // 0 overwrites C without reading it; otherwise C is accumulated into
  bool bias = false;  // add bias[N] to every row (fp32)
};

// C[M, N] (ldc) per `s`. A, B and C point at fp32 or bf16 (raw bits) data as `s` says. Threads: the
// OpenMP pool, or one thread when called inside a parallel region. Thread-safe.
void matmul(const MatmulShape& s, const void* A, const void* B, void* C, const float* bias = nullptr);

// The instruction set oneDNN dispatches to on this machine, e.g. "avx512_core_bf16" (for logs and
// benchmark tables), and the library version.
std::string matmul_isa();
// Whether bf16 products run natively here: AVX512-BF16 or AMX. Elsewhere oneDNN emulates them (AVX-512) or
// they run on fp32 copies (AVX2), slower than fp32 itself.
bool matmul_has_native_bf16();
std::string matmul_library_version();

// How many primitives have been created so far (the cache's misses): constant once every shape of a
// training step has been seen.
int64_t matmul_primitives_created();

}  // namespace gpt::cpu
