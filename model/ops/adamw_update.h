// The decoupled AdamW update of one fp32 element, shared by the CPU loops (model/ops/cpu/cpu_adamw.cpp)
// and the CUDA kernels (model/ops/cuda/cuda_adamw.cu) so both backends compute the same expression in the
// same order: m and v move towards g and g^2, and the weight steps by
// lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w), with m_hat = m / (1 - beta1^t), v_hat likewise.
#pragma once
#include <cmath>
#include <cstdint>

#include "model/ops/host_device.h"

namespace gpt::ops {

// The scalars of one AdamW step over a flat buffer (Backend::adamw_step_flat). grad_scale multiplies
// every gradient element before the update (1 / loss scale, times the clipping factor): the same fp32
// product an in-place scaling pass would store.
struct AdamWHyper {
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float grad_scale = 1.f;
  int64_t step = 1;  // 1-based
};

// inv_bc1 and inv_bc2 are the bias corrections 1 / (1 - beta^t) (ops::check_adamw computes them).
GPT_HOST_DEVICE inline void adamw_update(float& w, float g, float& m, float& v, float lr, float beta1, float beta2,
                                         float eps, float weight_decay, float inv_bc1, float inv_bc2) {
  const float mi = beta1 * m + (1.f - beta1) * g;
  const float vi = beta2 * v + (1.f - beta2) * g * g;
  m = mi;
  v = vi;
  w -= lr * ((mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps) + weight_decay * w);
}

}  // namespace gpt::ops
