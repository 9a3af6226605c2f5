// The step's loss accumulation on the CPU: one microbatch's mean token loss from the cross-entropy's row
// statistics, added into an fp64 accumulator. The rows are summed in order on one thread, so the loss is
// the same whatever the thread count.
#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_tensor_access.h"
#include "model/ops/token_loss.h"

namespace gpt {

using namespace cpu;

void CpuBackend::ce_loss_accumulate(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                                    Tensor& loss_sum) {
  const int64_t n = ops::check_loss_rows(kChecks, row_max, sum_exp, target_logit, loss_sum, "ce_loss_accumulate");
  const float *mx = row_max.f32(), *se = sum_exp.f32(), *tl = target_logit.f32();
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += ops::token_loss(mx[i], se[i], tl[i]);
  loss_sum.data<double>()[0] += total / n;
}

}  // namespace gpt
