// The step's loss accumulation on the GPU: one microbatch's mean token loss from the cross-entropy's row
// statistics, added into an fp64 accumulator on the device, so a step's loss reaches the host with the
// step's one download instead of a download per microbatch. One block sums the rows in a fixed order
// (strided per thread, then a fixed tree), so the loss is reproducible run to run.
#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_reduce.cuh"
#include "model/ops/token_loss.h"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kThreads = 1024;

// loss_sum[0] += (sum over n < N of token_loss(row_max[n], sum_exp[n], target_logit[n])) / N. One block.
__global__ void loss_accumulate_kernel(const float* row_max, const float* sum_exp, const float* target_logit,
                                       int64_t n, double* loss_sum) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += ops::token_loss(row_max[i], sum_exp[i], target_logit[i]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) loss_sum[0] += acc / static_cast<double>(n);
}

}  // namespace

void CudaBackend::ce_loss_accumulate(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                                     Tensor& loss_sum) {
  const char* op = "ce_loss_accumulate";
  const int64_t n = ops::check_loss_rows(kChecks, row_max, sum_exp, target_logit, loss_sum, op);
  loss_accumulate_kernel<<<1, kThreads, 0, stream_>>>(row_max.f32(), sum_exp.f32(), target_logit.f32(), n,
                                                       loss_sum.data<double>());
  check_launch(op);
}

}  // namespace gpt
