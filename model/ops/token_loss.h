// The loss of one token from the vocab-parallel cross-entropy's per-row statistics (ce_row_max and
// ce_sum_exp, after their tensor-parallel reduction), in fp64: log(sum_exp) + row_max - target_logit. Shared
// by the CPU loop and the CUDA kernel of Backend::ce_loss_accumulate.
#pragma once
#include <cmath>

#include "model/ops/host_device.h"

namespace gpt::ops {

GPT_HOST_DEVICE inline double token_loss(float row_max, float sum_exp, float target_logit) {
  return log(static_cast<double>(sum_exp)) + row_max - target_logit;
}

}  // namespace gpt::ops
