// Causal self-attention on the CPU (multi-head, or grouped-query with G key/value heads shared by H/G query
// heads each), and attention between two blocks of positions (context parallelism's ring), flash-style:
// queries in blocks of kQueryRows against keys in blocks of kKeyRows, an online softmax, and per-thread
// scratch only, so memory does not grow with B*H*T^2 (the [B, H, T, T] probabilities are never formed).
// Q, K and V are read in place from the packed qkv rows (leading dimension (H + 2G)*D; query head h reads
// key/value group h / (H/G)), or from a block of queries and one of keys and values; one kernel per
// direction serves both, driven by a BlockGeometry. Block products are single-threaded oneDNN matmuls
// (cpu_matmul.h) issued from OpenMP loops; with bf16 activations, on CPUs with native bf16 products
// (AVX512-BF16 or AMX), they take bf16 operands (P and dS rounded to bf16 by the row kernels that make
// them, for the products that consume them, as fused GPU kernels do) and accumulate in fp32; elsewhere
// they run in fp32 on converted copies.
//
// Forward, per (sequence, head, query block), over key blocks j up to the diagonal:
//   S = scale Q K_j^T;  m' = max(m, rowmax S);  P = exp(S - m');  l = l e^(m - m') + rowsum P;
//   O = O e^(m - m') + P V_j;  finally out = O / l and lse = m + log l.
// Backward (FlashAttention-2's order), per (sequence, key/value group), for each query head of the group
// in turn, with Dv = rowsum(dO * out) per query row, over key blocks j and then the query blocks i that
// reach them (dQ, dK and dV accumulate in fp32: in dqkv itself when it is fp32, else in an fp32 copy
// rounded once; dK and dV sum over the group's heads):
//   P = exp(scale Q_i K_j^T - lse_i);  dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = P * (dP - Dv_i);
//   dQ_i += scale dS K_j;  dK_j += scale dS^T Q_i.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_dispatch.h"
#include "model/ops/cpu/cpu_math.h"
#include "model/ops/cpu/cpu_matmul.h"
#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/cpu/cpu_tensor_access.h"
#include "model/ops/half.h"

namespace gpt {

using namespace cpu;

namespace {

constexpr int64_t kQueryRows = 128;
constexpr int64_t kKeyRows = 256;
// The backward's query blocks are smaller: its products follow the causal diagonal more closely (at T = 256,
// 17% fewer score elements than with 128-row blocks), which pays for the smaller products there.
constexpr int64_t kBackwardQueryRows = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One thread's block product: C[M, N] (ldc) = alpha op(A) op(B) + beta C, A and B of type `t`, C fp32.
void product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, MatType t, const void* A, int64_t lda,
             const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  MatmulShape s;
  s.trans_a = ta, s.trans_b = tb;
  s.M = M, s.N = N, s.K = K;
  s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  s.a = s.b = t;
  s.alpha = alpha, s.beta = beta;
  matmul(s, A, B, C);
}

// Number of this block's columns that row i (global) may attend to: keys j0.. up to i, at most nc.
int64_t causal_columns(int64_t i, int64_t j0, int64_t nc) { return std::clamp<int64_t>(i - j0 + 1, 0, nc); }

// Online softmax step for one row of nc unscaled scores Q K^T, `valid` of them unmasked: with S = scale Q K^T
// the row becomes P = exp(S - m') (zero past `valid`), m and l are updated, and the factor e^(m - m') that
// rescales the row's running output is returned. (The products leave the softmax scale to these row
// kernels: an output scale or a sum in a bf16 product sends oneDNN 2.6 to a scalar post-processing loop.)
// With p16, P is written there rounded to bf16 (the operand of the product that consumes it) instead of
// into s.
GPT_CPU_KERNEL float online_softmax_row(float* s, int64_t valid, int64_t nc, float scale, float* m, float* l,
                                        uint16_t* p16) {
  const float m_new = std::max(*m, scale * max_of(s, valid, kNegInf));
  float sum = 0.f;
  if (m_new == kNegInf) valid = 0;  // nothing unmasked yet: the row stays empty
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < valid; ++c) {
    const float e = fast_exp(s[c] * scale - m_new);
    if (p16) p16[c] = fp32_to_bf16(e);
    else s[c] = e;
    sum += e;
  }
  for (int64_t c = valid; c < nc; ++c) {
    if (p16) p16[c] = 0;
    else s[c] = 0.f;
  }
  if (m_new == kNegInf) return 1.f;
  const float alpha = fast_exp(*m - m_new);
  *l = *l * alpha + sum;
  *m = m_new;
  return alpha;
}

// One row of unscaled scores back to probabilities from the row's log-sum-exp: P = exp(scale s - lse), zero
// past `valid`; also rounded into p16 when given.
GPT_CPU_KERNEL void probabilities_row(float* s, int64_t valid, int64_t nc, float scale, float lse, uint16_t* p16) {
#pragma omp simd
  for (int64_t c = 0; c < valid; ++c) {
    const float p = fast_exp(s[c] * scale - lse);
    s[c] = p;
    if (p16) p16[c] = fp32_to_bf16(p);
  }
  for (int64_t c = valid; c < nc; ++c) {
    s[c] = 0.f;
    if (p16) p16[c] = 0;
  }
}

// scale dS = scale P * (dP - dv) over one row (in place on dP, or rounded into ds16 when given), the softmax
// scale folded in for the dQ and dK products; masked columns have P = 0 and get 0.
GPT_CPU_KERNEL void softmax_backward_row(const float* p, float* dp, int64_t nc, float dv, float scale,
                                         uint16_t* ds16) {
#pragma omp simd
  for (int64_t c = 0; c < nc; ++c) {
    const float ds = scale * p[c] * (dp[c] - dv);
    if (ds16) ds16[c] = fp32_to_bf16(ds);
    else dp[c] = ds;
  }
}

GPT_CPU_KERNEL void scale_row(float* r, int64_t n, float alpha) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) r[c] *= alpha;
}

GPT_CPU_KERNEL float dot_row(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

// Copies an fp32 [rows, D] block (ld D) into rows of a packed float tensor (leading dimension ld, first
// element `first`), each row multiplied by scale[r] when given, rounded once to the tensor's dtype.
void store_rows(const float* block, int64_t rows, int64_t D, const float* scale, Tensor& t, int64_t first,
                int64_t ld, Windows& w) {
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = w.out(0, t, first + r * ld, D);
    const float* src = block + r * D;
    const float a = scale ? scale[r] : 1.f;
    for (int64_t c = 0; c < D; ++c) dst[c] = src[c] * a;
    w.store(0, t, first + r * ld, D);
  }
}

// The products run in bf16 when the activations are bf16 and this CPU multiplies bf16 natively (AVX512-BF16
// or AMX: matmul_has_native_bf16); else on fp32 copies of Q, K, V and dO, with P and dS kept in fp32.
bool bf16_products(const Tensor& qkv) { return qkv.dtype() == DType::BF16 && matmul_has_native_bf16(); }

// Where one call reads: element offsets (in the operands) of the B sequences' queries and keys. Query row i
// of sequence b, head h starts at q_first + b*q_seq + i*ldq + h*D; key row j of group g at k_first +
// b*k_seq + j*ldk + g*D, its value G*D further. Query i attends keys 0..i + offset (offset >= Tk - 1: all).
struct BlockGeometry {
  int64_t B, Tq, Tk, H, G, D;
  int64_t ldq, q_seq, q_first;
  int64_t ldk, k_seq, k_first;
  int64_t offset;
  int64_t group(int64_t h) const { return h / (H / G); }
};

// The packed qkv of B sequences of T positions, queries for the last Tq of each (attention_forward_last).
BlockGeometry packed_geometry(const ops::AttentionDims& d) {
  const int64_t ld = d.qkv_ld();
  return {d.B, d.Tq, d.T, d.H, d.G, d.D, ld, d.T * ld, d.q0() * ld, ld, d.T * ld, d.k_offset(), d.q0()};
}

// A query block against a key/value block (attention_block_*): rows of q and kv as backend.h describes.
BlockGeometry block_geometry(const Tensor& q, const Tensor& kv, const ops::AttentionDims& d, bool causal) {
  const int64_t ldq = q.dim(1), ldk = kv.dim(1);
  return {d.B, d.Tq, d.T, d.H, d.G, d.D, ldq, d.Tq * ldq, 0, ldk, d.T * ldk, ldk - 2 * d.G * d.D,
          causal ? 0 : d.T};
}

// Forward over a geometry: out [B*Tq, H*D] (any float dtype), lse F32 [B, H, Tq].
void attention_forward_kernel(const ProductOperand& xq, const ProductOperand& xk, MatType t, const BlockGeometry& g,
                              Tensor& out, float* lsep) {
  const int64_t B = g.B, Tq = g.Tq, Tk = g.Tk, H = g.H, G = g.G, D = g.D, ldo = H * D;
  const int64_t nblk = (Tq + kQueryRows - 1) / kQueryRows;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  // One task per (sequence, head, query block); later blocks see more keys and cost more, so they are
  // handed out dynamically. Query row i sees keys up to i + offset.
  const bool threaded = B * H * Tq * Tk * D > (1 << 16);  // tiny problems are not worth waking threads for
  // Scratch sized to the call: a decoding step (Tq = 1) needs one score row, not a whole block.
  const int64_t rows = std::min(kQueryRows, Tq), cols = std::min(kKeyRows, Tk);
#pragma omp parallel if (threaded)
  {
    std::vector<float> s(rows * cols), o(rows * D), m(rows), l(rows);
    std::vector<uint16_t> p16(t == MatType::BF16 ? rows * cols : 0);
    Windows w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * H * nblk; ++task) {
      const int64_t bh = task / nblk, blk = task % nblk;
      const int64_t b = bh / H, h = bh % H;
      const int64_t q = g.q_first + b * g.q_seq + h * D;  // element offsets of row 0
      const int64_t k = g.k_first + b * g.k_seq + g.group(h) * D, v = k + G * D;
      const int64_t i0 = blk * kQueryRows, nr = std::min(Tq, i0 + kQueryRows) - i0;
      const int64_t p0 = g.offset + i0;  // the last key the block's first query sees
      const int64_t keys = std::min(Tk, p0 + nr);  // keys past the block's last query are masked
      std::fill(o.begin(), o.end(), 0.f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t j0 = 0; j0 < keys; j0 += kKeyRows) {
        const int64_t nc = std::min(kKeyRows, keys - j0);
        product(false, true, nr, nc, D, 1.f, t, xq.at(q + i0 * g.ldq), g.ldq, xk.at(k + j0 * g.ldk), g.ldk, 0.f,
                s.data(), nc);
        for (int64_t r = 0; r < nr; ++r) {
          const float alpha =
              online_softmax_row(s.data() + r * nc, causal_columns(p0 + r, j0, nc), nc, scale, &m[r], &l[r],
                                 t == MatType::BF16 ? p16.data() + r * nc : nullptr);
          if (alpha != 1.f) scale_row(o.data() + r * D, D, alpha);
        }
        const void* p = t == MatType::BF16 ? static_cast<const void*>(p16.data()) : s.data();
        product(false, false, nr, D, nc, 1.f, t, p, nc, xk.at(v + j0 * g.ldk), g.ldk, 1.f, o.data(), D);
      }
      for (int64_t r = 0; r < nr; ++r) {
        lsep[bh * Tq + i0 + r] = m[r] + std::log(l[r]);
        l[r] = 1.f / l[r];
      }
      store_rows(o.data(), nr, D, l.data(), out, (b * Tq + i0) * ldo + h * D, ldo, w);
    }
  }
}

// fp32 gradient accumulators: dQ of query row i, head h at dq + q_first + b*q_seq + i*ldq + h*D; dK of key
// row j, group g at dk + k_first + b*k_seq + j*ldk + g*D and dV G*D further (the geometry's strides, with
// the accumulators' own leading dimensions).
struct GradAccumulators {
  float* dq;
  int64_t ldq, q_seq;
  float* dk;
  int64_t ldk, k_seq, k_first;
};

// Backward over a geometry: adds the gradient into the accumulators (which the caller zeroes or keeps).
void attention_backward_kernel(const ProductOperand& xq, const ProductOperand& xk, const ProductOperand& dO,
                               MatType t, const BlockGeometry& g, const Tensor& dout, const Tensor& out,
                               const float* lsep, const GradAccumulators& a) {
  const int64_t B = g.B, Tq = g.Tq, Tk = g.Tk, H = g.H, G = g.G, D = g.D, ldo = H * D;
  const bool bf16 = t == MatType::BF16;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
#pragma omp parallel if (B * H * Tq * Tk * D > (1 << 16))
  {
    std::vector<float> s(kBackwardQueryRows * kKeyRows), dp(s.size()), rowdot(Tq);
    std::vector<uint16_t> p16(bf16 ? s.size() : 0), ds16(p16.size());
    Windows w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < B * G; ++bg) {
      const int64_t b = bg / G, grp = bg % G;
      const int64_t k = g.k_first + b * g.k_seq + grp * D, v = k + G * D;  // element offsets of row 0
      float* dk = a.dk + a.k_first + b * a.k_seq + grp * D;
      float* dv = dk + G * D;
      for (int64_t h = grp * (H / G); h < (grp + 1) * (H / G); ++h) {
        const int64_t q = g.q_first + b * g.q_seq + h * D;
        const int64_t o = b * Tq * ldo + h * D;  // in out and dout
        float* dq = a.dq + b * a.q_seq + h * D;
        const float* lrow = lsep + (b * H + h) * Tq;
        for (int64_t i = 0; i < Tq; ++i) {
          const float* orow = w.in(1, out, o + i * ldo, D);
          rowdot[i] = dot_row(orow, w.in(2, dout, o + i * ldo, D), D);
        }
        for (int64_t j0 = 0; j0 < Tk; j0 += kKeyRows) {
          const int64_t nc = std::min(kKeyRows, Tk - j0);
          float *dkj = dk + j0 * a.ldk, *dvj = dv + j0 * a.ldk;
          // Query blocks that reach key j0 (query i sees keys up to i + offset): the block holding row
          // j0 - offset, then every block below it.
          const int64_t first = std::max<int64_t>(0, j0 - g.offset);
          for (int64_t i0 = first / kBackwardQueryRows * kBackwardQueryRows; i0 < Tq; i0 += kBackwardQueryRows) {
            const int64_t nr = std::min(kBackwardQueryRows, Tq - i0);
            // Keys past the block's last query are masked for all its rows: the products stop before them.
            const int64_t nk = std::min(nc, i0 + nr + g.offset - j0);
            product(false, true, nr, nk, D, 1.f, t, xq.at(q + i0 * g.ldq), g.ldq, xk.at(k + j0 * g.ldk), g.ldk, 0.f,
                    s.data(), nk);
            for (int64_t r = 0; r < nr; ++r)
              probabilities_row(s.data() + r * nk, causal_columns(i0 + r + g.offset, j0, nk), nk, scale,
                                lrow[i0 + r], bf16 ? p16.data() + r * nk : nullptr);
            const void* p = bf16 ? static_cast<const void*>(p16.data()) : s.data();
            product(true, false, nk, D, nr, 1.f, t, p, nk, dO.at(o + i0 * ldo), ldo, 1.f, dvj, a.ldk);
            product(false, true, nr, nk, D, 1.f, t, dO.at(o + i0 * ldo), ldo, xk.at(v + j0 * g.ldk), g.ldk, 0.f,
                    dp.data(), nk);
            for (int64_t r = 0; r < nr; ++r)
              softmax_backward_row(s.data() + r * nk, dp.data() + r * nk, nk, rowdot[i0 + r], scale,
                                   bf16 ? ds16.data() + r * nk : nullptr);
            const void* ds = bf16 ? static_cast<const void*>(ds16.data()) : dp.data();
            product(false, false, nr, D, nk, 1.f, t, ds, nk, xk.at(k + j0 * g.ldk), g.ldk, 1.f, dq + i0 * a.ldq,
                    a.ldq);
            product(true, false, nk, D, nr, 1.f, t, ds, nk, xq.at(q + i0 * g.ldq), g.ldq, 1.f, dkj, a.ldk);
          }
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::attention_forward_last(const Tensor& qkv, int64_t B, int64_t T, int64_t Tq, int64_t H, int64_t G,
                                        int64_t D, Tensor& out, Tensor& lse) {
  const char* op = "attention_forward";
  const ops::AttentionDims d = ops::check_attention_last(kChecks, qkv, out, lse, B, T, Tq, H, G, D, op);
  const ProductOperand x(qkv, bf16_products(qkv), op, "qkv");
  attention_forward_kernel(x, x, x.bf16() ? MatType::BF16 : MatType::F32, packed_geometry(d), out, lse.f32());
}

void CpuBackend::attention_block_forward(const Tensor& q, const Tensor& kv, int64_t B, int64_t Tq, int64_t Tk,
                                         int64_t H, int64_t G, int64_t D, bool causal, Tensor& out, Tensor& lse) {
  const char* op = "attention_block_forward";
  const ops::AttentionDims d = ops::check_attention_block(kChecks, q, kv, out, lse, B, Tq, Tk, H, G, D, causal, op);
  const bool bf16 = bf16_products(q) && bf16_products(kv);
  const ProductOperand xq(q, bf16, op, "q"), xk(kv, bf16, op, "kv");
  attention_forward_kernel(xq, xk, bf16 ? MatType::BF16 : MatType::F32, block_geometry(q, kv, d, causal), out,
                           lse.f32());
}

void CpuBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                    int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, Tensor& dqkv) {
  const char* op = "attention_backward";
  const ops::AttentionDims d = ops::check_attention(kChecks, qkv, out, lse, B, T, H, G, D, op);
  require_float(dout, op, "dout");
  require_numel(dout, B * T * H * D, op, "dout", "[B*T, H*D]");
  require_float(dqkv, op, "dqkv");
  require_numel(dqkv, qkv.numel(), op, "dqkv", "qkv's shape " + shape_str(qkv.shape()));
  const bool bf16 = bf16_products(qkv);
  const ProductOperand x(qkv, bf16, op, "qkv"), dO(dout, bf16, op, "dout");
  // An fp32 dqkv accumulates in place; a 16-bit one in an fp32 copy, rounded once.
  const bool in_place = dqkv.dtype() == DType::F32;
  std::vector<float> staged(in_place ? 0 : static_cast<size_t>(qkv.numel()));
  float* acc = in_place ? dqkv.f32() : staged.data();
  std::fill_n(acc, qkv.numel(), 0.f);
  const int64_t ld = d.qkv_ld();
  const GradAccumulators a{acc, ld, T * ld, acc, ld, T * ld, d.k_offset()};
  attention_backward_kernel(x, x, dO, bf16 ? MatType::BF16 : MatType::F32, packed_geometry(d), dout, out, lse.f32(),
                            a);
  if (!in_place) from_f32(acc, dqkv.raw(), dqkv.dtype(), dqkv.numel());
}

void CpuBackend::attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                          const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t G,
                                          int64_t D, bool causal, Tensor& dq, Tensor& dkv) {
  const char* op = "attention_block_backward";
  const ops::AttentionDims d =
      ops::check_attention_block_backward(kChecks, dout, q, kv, out, lse, B, Tq, Tk, H, G, D, causal, dq, dkv, op);
  const bool bf16 = bf16_products(q) && bf16_products(kv);
  const ProductOperand xq(q, bf16, op, "q"), xk(kv, bf16, op, "kv"), dO(dout, bf16, op, "dout");
  const int64_t ldq = H * D, ldk = 2 * G * D;
  const GradAccumulators a{dq.f32(), ldq, Tq * ldq, dkv.f32(), ldk, Tk * ldk, 0};
  attention_backward_kernel(xq, xk, dO, bf16 ? MatType::BF16 : MatType::F32, block_geometry(q, kv, d, causal), dout,
                            out, lse.f32(), a);
}

void CpuBackend::attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b, int64_t B,
                                 int64_t T, int64_t H, int64_t D) {
  ops::check_attention_merge(kChecks, out, lse, out_b, lse_b, B, T, H, D, "attention_merge");
  float* o = out.f32();
  float* l = lse.f32();
  const float* ob = out_b.f32();
  const float* lb = lse_b.f32();
#pragma omp parallel for schedule(static) if (B * T * H * D > (1 << 15))
  for (int64_t n = 0; n < B * T; ++n) {
    const int64_t b = n / T, t = n % T;
    for (int64_t h = 0; h < H; ++h) {
      float& la = l[(b * H + h) * T + t];
      const float lbv = lb[(b * H + h) * T + t];
      const float m = std::max(la, lbv);
      if (m == kNegInf) continue;  // neither block has a key for this query yet
      float* orow = o + n * H * D + h * D;
      const float* brow = ob + n * H * D + h * D;
      if (la == kNegInf) {  // nothing merged yet: take the block's (whatever out held)
        std::copy_n(brow, D, orow);
        la = lbv;
        continue;
      }
      const float merged = m + std::log(std::exp(la - m) + std::exp(lbv - m));
      const float wa = std::exp(la - merged), wb = std::exp(lbv - merged);
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) orow[c] = wa * orow[c] + wb * brow[c];
      la = merged;
    }
  }
}

void CpuBackend::copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) {
  const char* op = "copy_columns";
  ops::check_copy_columns(kChecks, src, src_col, dst, dst_col, width, op);
  const int64_t rows = src.dim(0), lds = src.dim(1), ldd = dst.dim(1);
#pragma omp parallel if (rows * width > (1 << 15))
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* in = w.in(0, src, r * lds + src_col, width);
      float* o = w.out(1, dst, r * ldd + dst_col, width);
      std::copy_n(in, width, o);
      w.store(1, dst, r * ldd + dst_col, width);
    }
  }
}

}  // namespace gpt
