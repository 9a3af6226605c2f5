// Packed AVX-512 GEMMs (see cpu_gemm.h). Structure of a classic packed GEMM (Goto / BLIS): C is walked in
// NC-column blocks; for each KC-deep slice of K the slice of op(B) is packed into NR-column micro-panels
// and each MC-row block of op(A) into MR-row micro-panels; a register-blocked MR x NR micro-kernel then
// multiplies one A micro-panel (from L2) by one B micro-panel (kept in L1).
// Both operands are packed as 32-bit "words" along K: for fp32 a word is one value, for bf16 a (k, k+1)
// pair, which is what vdpbf16ps consumes. B is packed [word][NR] (two zmm loads per word), A [word][MR]
// (one broadcast per row). Odd K (bf16) and ragged edges are zero-padded in the packed copies and masked
// at the store, so the micro-kernel never branches.
#include "model/ops/cpu/cpu_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "model/ops/cpu/cpu_parallel.h"

namespace gpt::cpu {

namespace {

constexpr int kMR = 12;  // rows of C per micro-kernel call: 12 x 2 accumulators = 24 zmm
constexpr int kNR = 32;  // columns of C per micro-kernel call: two zmm of 16 fp32
// Blocking in 32-bit words of K, measured on Zen 5 (48 KiB L1, 1 MiB L2) over the model's product shapes:
// a deep K slice keeps the passes over C few, which matters for the LM head (K = vocabulary or tokens).
constexpr int64_t kKW = 256;   // K slice: a B micro-panel is 256 * 32 * 4 B = 32 KiB (L1)
constexpr int64_t kMC = 96;    // rows per packed A block: 96 * 256 * 4 B = 96 KiB (L2)
constexpr int64_t kNC = 1536;  // columns per packed B block: 256 * 1536 * 4 B = 1.5 MiB

// Elements of T per 32-bit word along K.
template <class T>
constexpr int64_t kGroup = static_cast<int64_t>(sizeof(uint32_t) / sizeof(T));

// The word holding op(X)[., k .. k + group): `p` points at element k, `step` is the distance to element
// k + 1; `full` is false for a bf16 pair whose second element lies past the end of K (it is zero).
inline uint32_t word(const float* p, int64_t, bool) {
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}
inline uint32_t word(const uint16_t* p, int64_t step, bool full) {
  if (full && step == 1) {
    uint32_t w;
    std::memcpy(&w, p, sizeof w);
    return w;
  }
  return static_cast<uint32_t>(p[0]) | (full ? static_cast<uint32_t>(p[step]) << 16 : 0u);
}

// dst[c * ldd + r] = src[r * lds + c] for c < 16 and r < 16 (rows at or past `rows` read as zero), storing
// the first `out` (<= 16) values of each dst row: a 16 x 16 transpose of 32-bit words in registers
// (32-bit, 64-bit, then two 128-bit-lane shuffle stages), for the packing paths that run across the
// source's rows.
__attribute__((target("avx512f"))) void transpose16(const uint32_t* src, int64_t lds, int rows, uint32_t* dst,
                                                    int64_t ldd, int out) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_loadu_ps(reinterpret_cast<const float*>(src + i * lds)) : _mm512_setzero_ps();
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // u[4g + j], lane L: column 4L + j of rows 4g .. 4g+3.
  for (int g = 0; g < 16; g += 4) {
    const __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
    const __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
    u[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  const __mmask16 mask = out >= 16 ? 0xffff : static_cast<__mmask16>((1u << out) - 1);
  for (int j = 0; j < 4; ++j) {
    const __m512 x_lo = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44), y_lo = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44);
    const __m512 x_hi = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xee), y_hi = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xee);
    _mm512_mask_storeu_ps(reinterpret_cast<float*>(dst + (j)*ldd), mask, _mm512_shuffle_f32x4(x_lo, y_lo, 0x88));
    _mm512_mask_storeu_ps(reinterpret_cast<float*>(dst + (4 + j) * ldd), mask, _mm512_shuffle_f32x4(x_lo, y_lo, 0xdd));
    _mm512_mask_storeu_ps(reinterpret_cast<float*>(dst + (8 + j) * ldd), mask, _mm512_shuffle_f32x4(x_hi, y_hi, 0x88));
    _mm512_mask_storeu_ps(reinterpret_cast<float*>(dst + (12 + j) * ldd), mask, _mm512_shuffle_f32x4(x_hi, y_hi, 0xdd));
  }
}

// Whether rows of X (elements of T, leading dimension ld, starting at p) can be read as 32-bit words.
template <class T>
bool word_rows(const T* p, int64_t ld) {
  return kGroup<T> == 1 || (ld % 2 == 0 && reinterpret_cast<uintptr_t>(p) % 4 == 0);
}

// Packs rows [i0, i0+mc) x elements [k0, k0+kc) of op(A) into MR-row micro-panels of words.
template <class T>
void pack_a(bool trans, const T* A, int64_t lda, int64_t i0, int64_t mc, int64_t k0, int64_t kc, uint32_t* dst) {
  constexpr int64_t G = kGroup<T>;
  const int64_t words = (kc + G - 1) / G, full = kc / G;  // full: words whose every element is inside K
  for (int64_t p = 0; p < mc; p += kMR) {
    uint32_t* panel = dst + (p / kMR) * words * kMR;
    const int rows = static_cast<int>(std::min<int64_t>(kMR, mc - p));
    if (trans) {  // op(A)[i, k] = A[k, i]: a word's elements sit in consecutive rows of A
      for (int64_t w = 0; w < words; ++w) {
        const T* src = A + (k0 + G * w) * lda + i0 + p;
        uint32_t* out = panel + w * kMR;
        for (int r = 0; r < kMR; ++r) out[r] = r < rows ? word(src + r, lda, w < full) : 0;
      }
    } else {  // a word is contiguous along a row of A: transpose 16-word blocks, then the tail word by word
      const T* first = A + (i0 + p) * lda + k0;
      int64_t fast = 0;
      if (word_rows(first, lda)) {
        for (; fast + 16 <= full; fast += 16)
          transpose16(reinterpret_cast<const uint32_t*>(first) + fast, lda / G, rows, panel + fast * kMR, kMR, kMR);
      }
      for (int r = 0; r < kMR; ++r) {
        if (r >= rows) {
          for (int64_t w = 0; w < words; ++w) panel[w * kMR + r] = 0;
          continue;
        }
        const T* row = A + (i0 + p + r) * lda + k0;
        for (int64_t w = fast; w < words; ++w) panel[w * kMR + r] = word(row + G * w, 1, w < full);
      }
    }
  }
}

// Packs elements [k0, k0+kc) x columns [j0, j0+nc) of op(B) into NR-column micro-panels of words.
template <class T>
void pack_b(bool trans, const T* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0, int64_t nc, uint32_t* dst) {
  constexpr int64_t G = kGroup<T>;
  const int64_t words = (kc + G - 1) / G, full = kc / G;
  for (int64_t q = 0; q < nc; q += kNR) {
    uint32_t* panel = dst + (q / kNR) * words * kNR;
    const int64_t width = std::min<int64_t>(kNR, nc - q);
    if (trans) {  // op(B)[k, j] = B[j, k]: a word is contiguous along a row of B
      const T* first = B + (j0 + q) * ldb + k0;
      int64_t fast = 0;
      if (word_rows(first, ldb)) {  // 16-word blocks of each 16-column half by transposes
        for (; fast + 16 <= full; fast += 16) {
          for (int h = 0; h < kNR; h += 16) {
            const int rows = static_cast<int>(std::clamp<int64_t>(width - h, 0, 16));
            transpose16(reinterpret_cast<const uint32_t*>(first + h * ldb) + fast, ldb / G, rows,
                        panel + fast * kNR + h, kNR, 16);
          }
        }
      }
      for (int64_t c = 0; c < kNR; ++c) {
        if (c >= width) {
          for (int64_t w = fast; w < words; ++w) panel[w * kNR + c] = 0;
          continue;
        }
        const T* row = B + (j0 + q + c) * ldb + k0;
        for (int64_t w = fast; w < words; ++w) panel[w * kNR + c] = word(row + G * w, 1, w < full);
      }
    } else {  // a word's elements sit in consecutive rows of B
      for (int64_t w = 0; w < words; ++w) {
        const T* src = B + (k0 + G * w) * ldb + j0 + q;
        uint32_t* out = panel + w * kNR;
        for (int c = 0; c < kNR; ++c) out[c] = c < width ? word(src + c, ldb, w < full) : 0;
      }
    }
  }
}

// The two micro-kernel steps: load a B vector, broadcast an A word, acc += a x b in the step's precision.
struct Bf16Step {
  using Vec = __m512i;
  __attribute__((target("avx512f,avx512bf16"))) static Vec load(const uint32_t* p) { return _mm512_loadu_si512(p); }
  __attribute__((target("avx512f,avx512bf16"))) static Vec broadcast(const uint32_t* p) {
    return _mm512_set1_epi32(static_cast<int>(*p));
  }
  __attribute__((target("avx512f,avx512bf16"))) static __m512 apply(__m512 acc, Vec a, Vec b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
  }
};
struct F32Step {
  using Vec = __m512;
  __attribute__((target("avx512f,avx512bf16"))) static Vec load(const uint32_t* p) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  }
  __attribute__((target("avx512f,avx512bf16"))) static Vec broadcast(const uint32_t* p) {
    return _mm512_set1_ps(*reinterpret_cast<const float*>(p));
  }
  __attribute__((target("avx512f,avx512bf16"))) static __m512 apply(__m512 acc, Vec a, Vec b) {
    return _mm512_fmadd_ps(a, b, acc);
  }
};

// C[mr, nr] += alpha * (A micro-panel . B micro-panel) over `words` words of K. Both instantiations are
// compiled with AVX512-BF16 enabled so the step inlines; the fp32 one contains no bf16 instruction and
// runs on any AVX-512F CPU.
template <class Step>
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline void micro_kernel_body(
    int64_t words, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, float alpha, int mr, int nr) {
  // The C tile is read once at the end: fetch it now so the loads overlap with the products.
  for (int r = 0; r < mr; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
  }
  __m512 acc[kMR][2];
#pragma GCC unroll 12
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t w = 0; w < words; ++w) {
    const typename Step::Vec b0 = Step::load(b);
    const typename Step::Vec b1 = Step::load(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < kMR; ++r) {
      const typename Step::Vec av = Step::broadcast(a + r);
      acc[r][0] = Step::apply(acc[r][0], av, b0);
      acc[r][1] = Step::apply(acc[r][1], av, b1);
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

__attribute__((target("avx512f,avx512bf16"))) void micro_kernel(const uint16_t*, int64_t words, const uint32_t* a,
                                                                 const uint32_t* b, float* c, int64_t ldc, float alpha,
                                                                 int mr, int nr) {
  micro_kernel_body<Bf16Step>(words, a, b, c, ldc, alpha, mr, nr);
}
__attribute__((target("avx512f,avx512bf16"))) void micro_kernel(const float*, int64_t words, const uint32_t* a, const uint32_t* b,
                                                     float* c, int64_t ldc, float alpha, int mr, int nr) {
  micro_kernel_body<F32Step>(words, a, b, c, ldc, alpha, mr, nr);
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

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  scale_c(M, N, beta, C, ldc);
  if (K <= 0 || alpha == 0.f) return;
  constexpr int64_t G = kGroup<T>, kKC = kKW * G;  // K slice in elements
  thread_local std::vector<uint32_t> a_pack, b_pack;
  a_pack.resize(static_cast<size_t>(kMC * kKW));
  b_pack.resize(static_cast<size_t>(kNC * kKW));
  for (int64_t jc = 0; jc < N; jc += kNC) {
    const int64_t nc = std::min(kNC, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKC) {
      const int64_t kc = std::min(kKC, K - pc), words = (kc + G - 1) / G;
      pack_b(trans_b, B, ldb, pc, kc, jc, nc, b_pack.data());
      for (int64_t ic = 0; ic < M; ic += kMC) {
        const int64_t mc = std::min(kMC, M - ic);
        pack_a(trans_a, A, lda, ic, mc, pc, kc, a_pack.data());
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const uint32_t* bp = b_pack.data() + (jr / kNR) * words * kNR;
          const int nr = static_cast<int>(std::min<int64_t>(kNR, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
            micro_kernel(A, words, a_pack.data() + (ir / kMR) * words * kMR, bp, C + (ic + ir) * ldc + jc + jr, ldc,
                         alpha, mr, nr);
          }
        }
      }
    }
  }
}

template <class T>
void parallel_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                   const T* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for_each_product_slab(M, N, K, [&](bool split_m, int64_t lo, int64_t hi) {
    if (split_m) {
      const T* a = trans_a ? A + lo : A + lo * lda;
      gemm(trans_a, trans_b, hi - lo, N, K, alpha, a, lda, B, ldb, beta, C + lo * ldc, ldc);
    } else {
      const T* b = trans_b ? B + lo * ldb : B + lo;
      gemm(trans_a, trans_b, M, hi - lo, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
    }
  });
}

bool own_kernels_allowed() {
  const char* env = std::getenv("GPT_CPU_GEMM");
  return !(env && std::strcmp(env, "openblas") == 0);
}

}  // namespace

bool f32_gemm_available() {
  static const bool available = [] {
    __builtin_cpu_init();
    return own_kernels_allowed() && __builtin_cpu_supports("avx512f");
  }();
  return available;
}

bool bf16_gemm_available() {
  static const bool available = [] {
    __builtin_cpu_init();
    return own_kernels_allowed() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  }();
  return available;
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void parallel_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                        int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  parallel_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void parallel_gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                       int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  parallel_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace gpt::cpu
