// The per-element math of the Llama-style ops (Backend::swiglu_* and Backend::rope_*), shared by the CPU
// loops (model/ops/cpu/cpu_llama.cpp) and the CUDA kernels (model/ops/cuda/cuda_llama.cu) so both backends
// compute the same expressions in the same order. The sigmoid is passed in: each backend evaluates exp its
// own way (a vectorising polynomial on the CPU, expf on the GPU).
#pragma once
#include <cmath>
#include <cstdint>

#include "model/ops/host_device.h"

namespace gpt::ops {

// SwiGLU of one (gate, up) pair given sig = sigmoid(gate): silu(gate) * up.
GPT_HOST_DEVICE inline float swiglu_value(float gate, float up, float sig) { return gate * sig * up; }

// Its gradients for dy: dgate = dy * up * silu'(gate), silu'(g) = sig * (1 + g * (1 - sig)); dup = dy * silu(gate).
GPT_HOST_DEVICE inline void swiglu_grad(float dy, float gate, float up, float sig, float& dgate, float& dup) {
  dgate = dy * up * sig * (1.f + gate * (1.f - sig));
  dup = dy * gate * sig;
}

// theta_i = base^(-2i/R) as Megatron-LM and Hugging Face compute it: the exponent 2i/R rounded to fp32
// (arange(0, R, 2).float() / R), the power and reciprocal evaluated in double and rounded once to fp32
// (their fp32 pow is within an ulp of this).
GPT_HOST_DEVICE inline float rope_inv_freq(int64_t i, int64_t R, float base) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(R);
  return static_cast<float>(1.0 / pow(static_cast<double>(base), static_cast<double>(e)));
}

// cos and sin of the fp32 angle fp32(pos) * theta (rounded to fp32, as in their fp32 outer product),
// evaluated in double and rounded to fp32.
GPT_HOST_DEVICE inline void rope_cos_sin(int64_t pos, float inv_freq, float& c, float& s) {
  const float angle = static_cast<float>(pos) * inv_freq;
  c = static_cast<float>(cos(static_cast<double>(angle)));
  s = static_cast<float>(sin(static_cast<double>(angle)));
}

// One rotated pair (x_i, x_{i+R/2}) in place; the backward pass rotates by -angle (sin negated).
GPT_HOST_DEVICE inline void rope_rotate(float& a, float& b, float c, float s) {
  const float x0 = a, x1 = b;
  a = x0 * c - x1 * s;
  b = x1 * c + x0 * s;
}

}  // namespace gpt::ops
