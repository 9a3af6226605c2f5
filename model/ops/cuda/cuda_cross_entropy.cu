// Softmax cross-entropy over a possibly vocab-sharded logits [N, Vl] on the GPU, in the three stages the
// caller interleaves with tensor-parallel all-reduces (row max; sum of exponentials and the target's
// logit; gradient). One block per row, reductions as fixed trees (cuda_reduce.cuh). Columns whose global
// id is at or past vocab_size are padding: skipped by every stage and given a zero gradient. A target
// outside [0, vocab_size) is reported through the device error report, raised at the next
// synchronisation (the step's download of its sums, or an evaluation's loss download).
#include <algorithm>

#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_device_error.cuh"
#include "model/ops/cuda/cuda_half.cuh"
#include "model/ops/cuda/cuda_reduce.cuh"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kThreads = 256;

struct Logits {
  const void* ptr;
  DType dtype;
  int64_t cols;  // Vl, including padding
  int64_t real;  // leading columns holding real vocabulary entries
};

// row_max[n] = max over real columns (-inf when there are none). Grid = N blocks.
__global__ void ce_row_max_kernel(Logits l, float* row_max) {
  const int64_t n = blockIdx.x;
  float m = -__int_as_float(0x7f800000);
  for (int64_t c = threadIdx.x; c < l.real; c += blockDim.x) m = fmaxf(m, load_as_f32(l.ptr, l.dtype, n * l.cols + c));
  m = block_max(m);
  if (threadIdx.x == 0) row_max[n] = m;
}

// Row n's target logit when target t lies in this shard, else 0; a target outside the vocabulary is
// reported for `op`.
__device__ float checked_target_logit(Logits l, int64_t n, int32_t t, int64_t vocab_start, int64_t vocab_size,
                                      CudaOp op, DeviceErrorReport* report) {
  if (t < 0 || t >= vocab_size) report_device_error(report, DeviceError::TargetOutOfVocabulary, op, n, t, vocab_size);
  const int64_t local = static_cast<int64_t>(t) - vocab_start;
  return (local >= 0 && local < l.real) ? load_as_f32(l.ptr, l.dtype, n * l.cols + local) : 0.f;
}

// sum_exp[n] = sum over real columns of exp(logit - row_max[n]); target_logit[n] = the target's logit
// when it lies in this shard, else 0.
__global__ void ce_sum_exp_kernel(Logits l, const float* row_max, const int32_t* targets, int64_t vocab_start,
                                  int64_t vocab_size, float* sum_exp, float* target_logit, DeviceErrorReport* report) {
  const int64_t n = blockIdx.x;
  const float mx = row_max[n];
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < l.real; c += blockDim.x) s += expf(load_as_f32(l.ptr, l.dtype, n * l.cols + c) - mx);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    sum_exp[n] = s;
    target_logit[n] = checked_target_logit(l, n, targets[n], vocab_start, vocab_size, CudaOp::CeSumExp, report);
  }
}

// ce_row_max and ce_sum_exp in one read of the row (online softmax): each thread keeps a running max and
// its sum of exp(logit - running max), rescaled when the max rises; the block then takes the max and brings
// each thread's sum to it before adding. Grid = N blocks.
__global__ void ce_row_stats_kernel(Logits l, const int32_t* targets, int64_t vocab_start, int64_t vocab_size,
                                    float* row_max, float* sum_exp, float* target_logit, DeviceErrorReport* report) {
  const int64_t n = blockIdx.x;
  const float neg_inf = -__int_as_float(0x7f800000);
  float m = neg_inf, s = 0.f;
  for (int64_t c = threadIdx.x; c < l.real; c += blockDim.x) {
    const float x = load_as_f32(l.ptr, l.dtype, n * l.cols + c);
    if (x > m) {
      s = s * expf(m - x) + 1.f;  // the first value: expf(-inf) = 0
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  const float mx = block_max(m);
  s = block_sum(m == neg_inf ? 0.f : s * expf(m - mx));
  if (threadIdx.x == 0) {
    row_max[n] = mx;
    sum_exp[n] = s;
    target_logit[n] = checked_target_logit(l, n, targets[n], vocab_start, vocab_size, CudaOp::CeRowStats, report);
  }
}

// sum_exp[i] *= exp(local_max[i] - global_max[i]); 0 for a shard without real columns.
__global__ void ce_rescale_sum_exp_kernel(const float* local_max, const float* global_max, float* sum_exp, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float lm = local_max[i];
  sum_exp[i] = lm == -__int_as_float(0x7f800000) ? 0.f : sum_exp[i] * expf(lm - global_max[i]);
}

// dlogits[n, c] = grad_scale * (softmax - onehot(target)), 0 on padding columns. Grid = N blocks.
__global__ void ce_backward_kernel(Logits l, const float* row_max, const float* sum_exp, const int32_t* targets,
                                   int64_t vocab_start, int64_t vocab_size, float grad_scale, void* dlogits, DType dd,
                                   DeviceErrorReport* report) {
  const int64_t n = blockIdx.x;
  const float mx = row_max[n];
  const float coef = grad_scale / sum_exp[n];  // grad_scale * softmax = coef * exp(logit - max)
  const int32_t t = targets[n];
  if (threadIdx.x == 0 && (t < 0 || t >= vocab_size))
    report_device_error(report, DeviceError::TargetOutOfVocabulary, CudaOp::CeBackward, n, t, vocab_size);
  const int64_t local = static_cast<int64_t>(t) - vocab_start;
  for (int64_t c = threadIdx.x; c < l.cols; c += blockDim.x) {
    float d = 0.f;
    if (c < l.real) {
      d = coef * expf(load_as_f32(l.ptr, l.dtype, n * l.cols + c) - mx);
      if (c == local) d -= grad_scale;
    }
    store_from_f32(dlogits, dd, n * l.cols + c, d);
  }
}

Logits check_logits(const Tensor& logits, int64_t vocab_start, int64_t vocab_size, const char* op) {
  const ops::VocabShard v = ops::check_logits(kChecks, logits, vocab_start, vocab_size, op);
  require(v.rows <= 0x7fffffff, op, "too many rows");
  return {logits.raw(), logits.dtype(), v.cols, v.real};
}

int64_t rows_of(const Tensor& logits) { return logits.numel() / logits.dim(-1); }

}  // namespace

void CudaBackend::ce_row_max(const Tensor& logits, int64_t vocab_start, int64_t vocab_size, Tensor& row_max) {
  const char* op = "ce_row_max";
  const Logits l = check_logits(logits, vocab_start, vocab_size, op);
  const int64_t N = rows_of(logits);
  ops::check_row_vector(kChecks, row_max, N, op, "row_max");
  if (N == 0) return;
  ce_row_max_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_>>>(l, row_max.f32());
  check_launch(op);
}

void CudaBackend::ce_sum_exp(const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start,
                             int64_t vocab_size, Tensor& sum_exp, Tensor& target_logit) {
  const char* op = "ce_sum_exp";
  const Logits l = check_logits(logits, vocab_start, vocab_size, op);
  const int64_t N = rows_of(logits);
  ops::check_ce_row_stats(kChecks, logits, targets, vocab_start, vocab_size, row_max, sum_exp, target_logit, op);
  if (N == 0) return;
  ce_sum_exp_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_>>>(
      l, row_max.f32(), targets.i32(), vocab_start, vocab_size, sum_exp.f32(), target_logit.f32(), error_device_);
  check_launch(op);
}

void CudaBackend::ce_row_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                               Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  const char* op = "ce_row_stats";
  const Logits l = check_logits(logits, vocab_start, vocab_size, op);
  const int64_t N = rows_of(logits);
  ops::check_ce_row_stats(kChecks, logits, targets, vocab_start, vocab_size, row_max, sum_exp, target_logit, op);
  if (N == 0) return;
  ce_row_stats_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_>>>(
      l, targets.i32(), vocab_start, vocab_size, row_max.f32(), sum_exp.f32(), target_logit.f32(), error_device_);
  check_launch(op);
}

void CudaBackend::ce_rescale_sum_exp(const Tensor& local_max, const Tensor& global_max, Tensor& sum_exp) {
  const char* op = "ce_rescale_sum_exp";
  const int64_t N = ops::check_ce_rescale(kChecks, local_max, global_max, sum_exp, op);
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>((N + kThreads - 1) / kThreads);
  ce_rescale_sum_exp_kernel<<<blocks, kThreads, 0, stream_>>>(local_max.f32(), global_max.f32(), sum_exp.f32(), N);
  check_launch(op);
}

void CudaBackend::ce_backward(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                              const Tensor& targets, int64_t vocab_start, int64_t vocab_size, float grad_scale,
                              Tensor& dlogits) {
  const char* op = "ce_backward";
  const Logits l = check_logits(logits, vocab_start, vocab_size, op);
  const int64_t N = rows_of(logits);
  ops::check_row_vector(kChecks, row_max, N, op, "row_max");
  ops::check_row_vector(kChecks, sum_exp, N, op, "sum_exp");
  ops::check_targets_shape(kChecks, targets, N, op);
  require_float(dlogits, op, "dlogits");
  require_numel(dlogits, logits.numel(), op, "dlogits", "logits' shape " + shape_str(logits.shape()));
  if (N == 0) return;
  ce_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_>>>(l, row_max.f32(), sum_exp.f32(),
                                                                         targets.i32(), vocab_start, vocab_size,
                                                                         grad_scale, dlogits.raw(), dlogits.dtype(),
                                                                         error_device_);
  check_launch(op);
}

}  // namespace gpt
