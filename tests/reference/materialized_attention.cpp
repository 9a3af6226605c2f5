// Test-only reference: the CPU backend's materialised attention (see materialized_attention.h), compiled
// as it was in the backend (row kernels dispatched per instruction set), so benchmarks against it are fair. Work is
// cut into blocks of kBlock query rows that skip the masked upper triangle except for the diagonal
// blocks; products are single-threaded oneDNN matmuls issued from OpenMP loops.
//
// Backward, per (b, h) with P the softmax and S = scale * Q K^T:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  dQ = scale dS K,  dK = scale dS^T Q.
#include "tests/reference/materialized_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "model/ops/cpu/cpu_dispatch.h"
#include "model/ops/cpu/cpu_math.h"
#include "model/ops/cpu/cpu_matmul.h"
#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt::reference {

using namespace cpu;

namespace {

// qkv [B*T, (H + 2G)*D] of a float dtype and probs [B, H, T, T].
ops::AttentionDims check(const Tensor& qkv, const Tensor& probs, int64_t B, int64_t T, int64_t H, int64_t G,
                         int64_t D, const char* op) {
  ops::check_head_counts(kChecks, B, T, H, G, D, op);
  require_float(qkv, op, "qkv");
  require_numel(qkv, B * T * (H + 2 * G) * D, op, "qkv", "[B*T, (H+2G)*D]");
  require_numel(probs, B * H * T * T, op, "probs", "[B, H, T, T]");
  return {B, T, H, G, D, T};
}

constexpr int64_t kBlock = 64;

int64_t query_blocks(int64_t T) { return (T + kBlock - 1) / kBlock; }

// Row-major fp32 C[M,N] = alpha * op(A) . op(B) + beta * C (one thread inside the OpenMP loops below).
void product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
             const float* B, int64_t ldb, float* C, int64_t ldc, float beta = 0.f) {
  MatmulShape s;
  s.trans_a = ta, s.trans_b = tb;
  s.M = M, s.N = N, s.K = K;
  s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  s.alpha = alpha, s.beta = beta;
  matmul(s, A, B, C);
}

// Softmax of row i of a causal score block in place: columns 0..i are real, i+1..T-1 become zero.
GPT_CPU_KERNEL void causal_softmax_row(float* row, int64_t i, int64_t T) {
  const float mx = max_of(row, i + 1, -std::numeric_limits<float>::infinity());
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j <= i; ++j) {
    const float e = fast_exp(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
  for (int64_t j = i + 1; j < T; ++j) row[j] = 0.f;
}

// Row i of dP (in place) becomes scale * dS = scale * P * (dP - rowsum(P * dP)) over its causal columns
// 0..i; the masked rest of the diagonal block (up to i1) becomes zero.
GPT_CPU_KERNEL void softmax_backward_row(const float* pr, float* sr, int64_t i, int64_t i1, float scale) {
  float dot = 0.f;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j <= i; ++j) dot += pr[j] * sr[j];
#pragma omp simd
  for (int64_t j = 0; j <= i; ++j) sr[j] = scale * pr[j] * (sr[j] - dot);
  for (int64_t j = i + 1; j < i1; ++j) sr[j] = 0.f;
}

}  // namespace

void materialized_attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                                    Tensor& out, Tensor& probs) {
  const char* op = "attention_forward";
  const ops::AttentionDims d = check(qkv, probs, B, T, H, G, D, op);
  require_numel(out, B * T * H * D, op, "out", "[B*T, H*D]");
  F32Input qf(qkv, op, "qkv");
  F32Output of(out, false, op, "out");
  const float* base = qf.get();
  float* outp = of.get();
  float* pp = probs.f32();
  const int64_t ld = d.qkv_ld(), ldo = d.out_ld(), nblk = query_blocks(T);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));

  // One task per (sequence, head, query block); blocks further down the sequence cost more, so hand them
  // out dynamically.
  const bool threaded = B * H * T * T * D > (1 << 16);  // tiny problems are not worth waking threads for
#pragma omp parallel for schedule(dynamic, 1) if (threaded)
  for (int64_t task = 0; task < B * H * nblk; ++task) {
    const int64_t bh = task / nblk, blk = task % nblk;
    const int64_t b = bh / H, h = bh % H;
    const float* q = base + b * T * ld + h * D;
    const float* k = base + b * T * ld + d.k_offset() + d.group(h) * D;
    const float* v = k + G * D;
    float* o = outp + b * T * ldo + h * D;
    float* p = pp + bh * T * T;
    const int64_t i0 = blk * kBlock, i1 = std::min(T, i0 + kBlock), m = i1 - i0;
    // Scores for query rows i0..i1 against keys 0..i1 (later keys are all masked).
    product(false, true, m, i1, D, scale, q + i0 * ld, ld, k, ld, p + i0 * T, T);
    for (int64_t i = i0; i < i1; ++i) causal_softmax_row(p + i * T, i, T);
    product(false, false, m, D, i1, 1.f, p + i0 * T, T, v, ld, o + i0 * ldo, ldo);
  }
  of.commit();
}

void materialized_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t B,
                                     int64_t T, int64_t H, int64_t G, int64_t D, Tensor& dqkv) {
  const char* op = "attention_backward";
  const ops::AttentionDims d = check(qkv, probs, B, T, H, G, D, op);
  require_numel(dout, B * T * H * D, op, "dout", "[B*T, H*D]");
  require_numel(dqkv, qkv.numel(), op, "dqkv", "qkv's shape " + shape_str(qkv.shape()));
  F32Input qf(qkv, op, "qkv"), df(dout, op, "dout");
  F32Output gf(dqkv, false, op, "dqkv");
  const float *base = qf.get(), *dbase = df.get(), *pp = probs.f32();
  float* gbase = gf.get();
  const int64_t ld = d.qkv_ld(), ldo = d.out_ld(), nblk = query_blocks(T);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));

#pragma omp parallel if (B * H * T * T * D > (1 << 16))
  {
    // dP, turned into scale * dS in place; only the lower-triangle blocks are ever written or read.
    std::unique_ptr<float[]> ds(new float[T * T]);
    // One task per (sequence, key/value group): the group's heads in turn, dK and dV summed over them.
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < B * G; ++bg) {
      const int64_t b = bg / G, g = bg % G;
      for (int64_t h = g * d.group_size(); h < (g + 1) * d.group_size(); ++h) {
        const int64_t bh = b * H + h;
        const float beta = h == g * d.group_size() ? 0.f : 1.f;  // the group's first head overwrites dK, dV
        const float* q = base + b * T * ld + h * D;
        const float* k = base + b * T * ld + d.k_offset() + g * D;
        const float* v = k + G * D;
        const float* dO = dbase + b * T * ldo + h * D;
        float* dq = gbase + b * T * ld + h * D;
        float* dk = gbase + b * T * ld + d.k_offset() + g * D;
        float* dv = dk + G * D;
        const float* p = pp + bh * T * T;
        float* s = ds.get();
        for (int64_t blk = 0; blk < nblk; ++blk) {
          const int64_t i0 = blk * kBlock, i1 = std::min(T, i0 + kBlock), m = i1 - i0;
          product(false, true, m, i1, D, 1.f, dO + i0 * ldo, ldo, v, ld, s + i0 * T, T);
          for (int64_t i = i0; i < i1; ++i) softmax_backward_row(p + i * T, s + i * T, i, i1, scale);
          product(false, false, m, D, i1, 1.f, s + i0 * T, T, k, ld, dq + i0 * ld, ld);
        }
        // Key block j0..j1 is attended to by query rows j0..T only.
        for (int64_t blk = 0; blk < nblk; ++blk) {
          const int64_t j0 = blk * kBlock, j1 = std::min(T, j0 + kBlock), w = j1 - j0, rows = T - j0;
          product(true, false, w, D, rows, 1.f, s + j0 * T + j0, T, q + j0 * ld, ld, dk + j0 * ld, ld, beta);
          product(true, false, w, D, rows, 1.f, p + j0 * T + j0, T, dO + j0 * ldo, ldo, dv + j0 * ld, ld, beta);
        }
      }
    }
  }
  gf.commit();
}

}  // namespace gpt::reference
