// bf16 GEMM on AVX512-BF16 (see cpu_gemm_bf16.h). Structure of a classic packed GEMM (Goto / BLIS): C is
// walked in NC-column blocks; for each KC-deep slice of K the slice of op(B) is packed into NR-column
// micro-panels and each MC-row block of op(A) into MR-row micro-panels; a register-blocked MR x NR
// micro-kernel then multiplies one A micro-panel (from L2) by one B micro-panel (kept in L1). vdpbf16ps
// consumes K in pairs, so both operands are packed as 32-bit (k, k+1) pairs: B as [k/2][NR] pairs (two
// zmm loads per pair of k), A as [k/2][MR] pairs (one broadcast per row). Odd K and ragged edges are
// padded with zeros in the packed copies and masked at the store, so the kernel itself never branches.
#include "model/ops/cpu/cpu_gemm_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "model/ops/cpu/cpu_parallel.h"

namespace gpt::cpu {

namespace {

constexpr int kMR = 12;      // rows of C per micro-kernel call: 12 x 2 accumulators = 24 zmm
constexpr int kNR = 32;      // columns of C per micro-kernel call: two zmm of 16 fp32
// Measured on Zen 5 (48 KiB L1, 1 MiB L2) over the model's product shapes: a deeper K slice halves the
// passes over C, which dominate the LM head's products (K = vocabulary or tokens).
constexpr int64_t kKC = 512;   // K slice: a B micro-panel is 512/2 * 32 * 4 B = 32 KiB (L1)
constexpr int64_t kMC = 96;    // rows per packed A block: 96 * 512 * 2 B = 96 KiB (L2)
constexpr int64_t kNC = 1536;  // columns per packed B block: 512 * 1536 * 2 B = 1.5 MiB

inline uint32_t pair(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }

// Packs rows [i0, i0+mc) x k in [k0, k0+kc) of op(A) into MR-row micro-panels of (k, k+1) pairs.
void pack_a(bool trans, const uint16_t* A, int64_t lda, int64_t i0, int64_t mc, int64_t k0, int64_t kc, uint32_t* dst) {
  const int64_t kp_n = (kc + 1) / 2;
  const int64_t full_pairs = kc / 2;  // pairs whose k + 1 is inside the slice (kc <= K - k0)
  for (int64_t p = 0; p < mc; p += kMR) {
    uint32_t* panel = dst + (p / kMR) * kp_n * kMR;
    const int rows = static_cast<int>(std::min<int64_t>(kMR, mc - p));
    if (trans) {  // op(A)[i, k] = A[k, i]: rows k and k+1 of A interleaved
      for (int64_t kp = 0; kp < kp_n; ++kp) {
        const uint16_t* r0 = A + (k0 + 2 * kp) * lda + i0 + p;
        const uint16_t* r1 = kp < full_pairs ? r0 + lda : nullptr;
        uint32_t* out = panel + kp * kMR;
        for (int r = 0; r < kMR; ++r) out[r] = r < rows ? pair(r0[r], r1 ? r1[r] : 0) : 0;
      }
    } else {  // each pair is one 32-bit read along a row of A
      for (int r = 0; r < kMR; ++r) {
        if (r >= rows) {
          for (int64_t kp = 0; kp < kp_n; ++kp) panel[kp * kMR + r] = 0;
          continue;
        }
        const uint16_t* row = A + (i0 + p + r) * lda + k0;
        for (int64_t kp = 0; kp < full_pairs; ++kp) {
          uint32_t v;
          std::memcpy(&v, row + 2 * kp, sizeof v);
          panel[kp * kMR + r] = v;
        }
        if (kp_n > full_pairs) panel[full_pairs * kMR + r] = pair(row[2 * full_pairs], 0);
      }
    }
  }
}

// Packs k in [k0, k0+kc) x columns [j0, j0+nc) of op(B) into NR-column micro-panels of (k, k+1) pairs.
void pack_b(bool trans, const uint16_t* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0, int64_t nc, uint32_t* dst) {
  const int64_t kp_n = (kc + 1) / 2;
  const int64_t full_pairs = kc / 2;
  for (int64_t q = 0; q < nc; q += kNR) {
    uint32_t* panel = dst + (q / kNR) * kp_n * kNR;
    const int64_t width = std::min<int64_t>(kNR, nc - q);
    if (trans) {  // op(B)[k, j] = B[j, k]: each pair is one 32-bit read along a row of B
      for (int64_t c = 0; c < kNR; ++c) {
        if (c >= width) {
          for (int64_t kp = 0; kp < kp_n; ++kp) panel[kp * kNR + c] = 0;
          continue;
        }
        const uint16_t* row = B + (j0 + q + c) * ldb + k0;
        for (int64_t kp = 0; kp < full_pairs; ++kp) {
          uint32_t v;
          std::memcpy(&v, row + 2 * kp, sizeof v);
          panel[kp * kNR + c] = v;
        }
        if (kp_n > full_pairs) panel[full_pairs * kNR + c] = pair(row[2 * full_pairs], 0);
      }
    } else {  // op(B) = B: rows k and k+1 are interleaved column by column
      for (int64_t kp = 0; kp < kp_n; ++kp) {
        const uint16_t* r0 = B + (k0 + 2 * kp) * ldb + j0 + q;
        const uint16_t* r1 = kp < full_pairs ? r0 + ldb : nullptr;
        uint32_t* out = panel + kp * kNR;
        if (width == kNR && r1) {
          for (int c = 0; c < kNR; ++c) out[c] = pair(r0[c], r1[c]);
        } else {
          for (int c = 0; c < kNR; ++c) out[c] = c < width ? pair(r0[c], r1 ? r1[c] : 0) : 0;
        }
      }
    }
  }
}

// C[mr, nr] += alpha * (A micro-panel . B micro-panel) over kp_n pairs of k.
__attribute__((target("avx512f,avx512bf16"))) void micro_kernel(int64_t kp_n, const uint32_t* a, const uint32_t* b,
                                                                 float* c, int64_t ldc, float alpha, int mr, int nr) {
  // The C tile is read once at the end: fetch it now so the loads overlap with the products.
  for (int r = 0; r < mr; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
  }
  __m512 acc[kMR][2];
#pragma GCC unroll 12
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < kMR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
    a += kMR;
    b += kNR;
  }
  const __m512 va = _mm512_set1_ps(alpha);
  if (mr == kMR && nr == kNR) {
#pragma GCC unroll 12
    for (int r = 0; r < kMR; ++r) {
      float* row = c + r * ldc;
      _mm512_storeu_ps(row, _mm512_fmadd_ps(acc[r][0], va, _mm512_loadu_ps(row)));
      _mm512_storeu_ps(row + 16, _mm512_fmadd_ps(acc[r][1], va, _mm512_loadu_ps(row + 16)));
    }
    return;
  }
  const __mmask16 m0 = nr >= 16 ? 0xffff : static_cast<__mmask16>((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? 0xffff : nr > 16 ? static_cast<__mmask16>((1u << (nr - 16)) - 1) : 0;
  for (int r = 0; r < mr; ++r) {
    float* row = c + r * ldc;
    _mm512_mask_storeu_ps(row, m0, _mm512_fmadd_ps(acc[r][0], va, _mm512_maskz_loadu_ps(m0, row)));
    if (m1) _mm512_mask_storeu_ps(row + 16, m1, _mm512_fmadd_ps(acc[r][1], va, _mm512_maskz_loadu_ps(m1, row + 16)));
  }
}

void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  if (beta == 1.f) return;
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    if (beta == 0.f) {
      std::fill(row, row + N, 0.f);
    } else {
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
  }
}

bool detect() {
  if (const char* env = std::getenv("GPT_CPU_BF16_GEMM"); env && std::strcmp(env, "0") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
}

}  // namespace

bool bf16_gemm_available() {
  static const bool available = detect();
  return available;
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  scale_c(M, N, beta, C, ldc);
  if (K <= 0 || alpha == 0.f) return;
  thread_local std::vector<uint32_t> a_pack, b_pack;
  a_pack.resize(static_cast<size_t>(kMC * kKC / 2));
  b_pack.resize(static_cast<size_t>(kNC * kKC / 2));
  for (int64_t jc = 0; jc < N; jc += kNC) {
    const int64_t nc = std::min(kNC, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKC) {
      const int64_t kc = std::min(kKC, K - pc), kp_n = (kc + 1) / 2;
      pack_b(trans_b, B, ldb, pc, kc, jc, nc, b_pack.data());
      for (int64_t ic = 0; ic < M; ic += kMC) {
        const int64_t mc = std::min(kMC, M - ic);
        pack_a(trans_a, A, lda, ic, mc, pc, kc, a_pack.data());
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const uint32_t* bp = b_pack.data() + (jr / kNR) * kp_n * kNR;
          const int nr = static_cast<int>(std::min<int64_t>(kNR, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
            micro_kernel(kp_n, a_pack.data() + (ir / kMR) * kp_n * kMR, bp, C + (ic + ir) * ldc + jc + jr, ldc, alpha,
                         mr, nr);
          }
        }
      }
    }
  }
}

void parallel_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                        int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for_each_product_slab(M, N, K, [&](bool split_m, int64_t lo, int64_t hi) {
    if (split_m) {
      const uint16_t* a = trans_a ? A + lo : A + lo * lda;
      gemm_bf16(trans_a, trans_b, hi - lo, N, K, alpha, a, lda, B, ldb, beta, C + lo * ldc, ldc);
    } else {
      const uint16_t* b = trans_b ? B + lo * ldb : B + lo;
      gemm_bf16(trans_a, trans_b, M, hi - lo, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
    }
  });
}

}  // namespace gpt::cpu
