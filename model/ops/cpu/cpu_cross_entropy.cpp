// Softmax cross-entropy over a possibly vocab-sharded logits[N, Vl] on the CPU, in the three stages the
// caller interleaves with tensor-parallel all-reduces (row max, then sum of exponentials and the target's
// logit, then the gradient), or with the first two in one read of the logits (ce_row_stats). Columns whose global id is at or past vocab_size are padding: they are
// skipped by every stage and get a zero gradient, so they can never win the softmax.
#include <algorithm>
#include <cmath>
#include <limits>

#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_dispatch.h"
#include "model/ops/cpu/cpu_math.h"
#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {

using namespace cpu;

namespace {

// Targets must be real token ids; one outside the vocabulary would silently count as "in another shard".
const int32_t* check_targets(const Tensor& targets, int64_t rows, int64_t vocab_size, const char* op) {
  ops::check_targets_shape(kChecks, targets, rows, op);
  const int32_t* tp = targets.i32();
  for (int64_t n = 0; n < rows; ++n) {
    require(tp[n] >= 0 && tp[n] < vocab_size, op,
            "target " + std::to_string(tp[n]) + " at row " + std::to_string(n) + " is outside the vocabulary [0, " +
                std::to_string(vocab_size) + ")");
  }
  return tp;
}

// Row kernels: the maximum of n values, the sum of exp(x - mx), and coef * exp(x - mx).
GPT_CPU_KERNEL float row_max_of(const float* row, int64_t n) {
  return max_of(row, n, -std::numeric_limits<float>::infinity());
}

GPT_CPU_KERNEL float sum_exp_of(const float* row, int64_t n, float mx) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) sum += fast_exp(row[c] - mx);
  return sum;
}

GPT_CPU_KERNEL void scaled_exp(const float* row, float* out, int64_t n, float mx, float coef) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) out[c] = coef * fast_exp(row[c] - mx);
}

}  // namespace

void CpuBackend::ce_row_max(const Tensor& logits, int64_t vocab_start, int64_t vocab_size, Tensor& row_max) {
  const char* op = "ce_row_max";
  const ops::VocabShard s = ops::check_logits(kChecks, logits, vocab_start, vocab_size, op);
  ops::check_row_vector(kChecks, row_max, s.rows, op, "row_max");
  float* mp = row_max.f32();
#pragma omp parallel if (s.rows * s.real > (1 << 15))
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < s.rows; ++n) mp[n] = row_max_of(w.in(0, logits, n * s.cols, s.real), s.real);
  }
}

void CpuBackend::ce_sum_exp(const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start,
                            int64_t vocab_size, Tensor& sum_exp, Tensor& target_logit) {
  const char* op = "ce_sum_exp";
  const ops::VocabShard s =
      ops::check_ce_row_stats(kChecks, logits, targets, vocab_start, vocab_size, row_max, sum_exp, target_logit, op);
  const int32_t* tp = check_targets(targets, s.rows, vocab_size, op);
  const float* mp = row_max.f32();
  float *sp = sum_exp.f32(), *tlp = target_logit.f32();
#pragma omp parallel if (s.rows * s.real > (1 << 15))
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < s.rows; ++n) {
      const float* row = w.in(0, logits, n * s.cols, s.real);
      sp[n] = sum_exp_of(row, s.real, mp[n]);
      const int64_t local = static_cast<int64_t>(tp[n]) - vocab_start;
      tlp[n] = (local >= 0 && local < s.real) ? row[local] : 0.f;
    }
  }
}

// One visit per row: its max, then its sum of exponentials while the row is still in cache, so the logits
// are read from memory once (the same values as ce_row_max and ce_sum_exp give).
void CpuBackend::ce_row_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                              Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  const char* op = "ce_row_stats";
  const ops::VocabShard s =
      ops::check_ce_row_stats(kChecks, logits, targets, vocab_start, vocab_size, row_max, sum_exp, target_logit, op);
  const int32_t* tp = check_targets(targets, s.rows, vocab_size, op);
  float *mp = row_max.f32(), *sp = sum_exp.f32(), *tlp = target_logit.f32();
#pragma omp parallel if (s.rows * s.real > (1 << 15))
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < s.rows; ++n) {
      const float* row = w.in(0, logits, n * s.cols, s.real);
      mp[n] = row_max_of(row, s.real);
      sp[n] = sum_exp_of(row, s.real, mp[n]);
      const int64_t local = static_cast<int64_t>(tp[n]) - vocab_start;
      tlp[n] = (local >= 0 && local < s.real) ? row[local] : 0.f;
    }
  }
}

void CpuBackend::ce_rescale_sum_exp(const Tensor& local_max, const Tensor& global_max, Tensor& sum_exp) {
  const char* op = "ce_rescale_sum_exp";
  const int64_t n = ops::check_ce_rescale(kChecks, local_max, global_max, sum_exp, op);
  const float *lm = local_max.f32(), *gm = global_max.f32();
  float* sp = sum_exp.f32();
  for (int64_t i = 0; i < n; ++i)
    sp[i] = lm[i] == -std::numeric_limits<float>::infinity() ? 0.f : sp[i] * std::exp(lm[i] - gm[i]);
}

void CpuBackend::ce_backward(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                             const Tensor& targets, int64_t vocab_start, int64_t vocab_size, float grad_scale,
                             Tensor& dlogits) {
  const char* op = "ce_backward";
  const ops::VocabShard s = ops::check_logits(kChecks, logits, vocab_start, vocab_size, op);
  ops::check_row_vector(kChecks, row_max, s.rows, op, "row_max");
  ops::check_row_vector(kChecks, sum_exp, s.rows, op, "sum_exp");
  require_numel(dlogits, logits.numel(), op, "dlogits", "logits' shape " + shape_str(logits.shape()));
  const int32_t* tp = check_targets(targets, s.rows, vocab_size, op);
  require_float(dlogits, op, "dlogits");
  const float *mp = row_max.f32(), *sp = sum_exp.f32();
#pragma omp parallel if (s.rows * s.cols > (1 << 15))
  {
    Windows w;  // a bf16 gradient row is computed in fp32 and rounded once
#pragma omp for schedule(static)
    for (int64_t n = 0; n < s.rows; ++n) {
      const float* row = w.in(0, logits, n * s.cols, s.real);
      float* drow = w.out(1, dlogits, n * s.cols, s.cols);
      const float mx = mp[n];
      const float coef = grad_scale / sp[n];  // grad_scale * softmax = coef * exp(logit - max)
      scaled_exp(row, drow, s.real, mx, coef);
      for (int64_t c = s.real; c < s.cols; ++c) drow[c] = 0.f;
      const int64_t local = static_cast<int64_t>(tp[n]) - vocab_start;
      if (local >= 0 && local < s.real) drow[local] -= grad_scale;
      w.store(1, dlogits, n * s.cols, s.cols);
    }
  }
}

}  // namespace gpt
