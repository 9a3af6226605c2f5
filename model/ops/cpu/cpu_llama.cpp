// The Llama-style ops on the CPU: RMSNorm, SwiGLU and the rotary position embedding (backend.h). Each is an
// OpenMP loop over rows computing in fp32, a 16-bit row converted into the thread's fp32 window
// (cpu_tensor_access.h) and rounded back once, with the row kernels compiled per instruction set
// (cpu_dispatch.h). The per-element SwiGLU and rotation math is shared with the CUDA kernels
// (model/ops/llama_math.h). RMSNorm's backward is the closed form dx = rstd * (g - xhat * mean(g * xhat)),
// g = dy * gamma; its gamma gradient is summed per thread over a fixed block of rows and the partial sums
// are added in thread order, which keeps the result reproducible (as in cpu_layernorm.cpp).
#include <cmath>
#include <vector>

#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_dispatch.h"
#include "model/ops/cpu/cpu_math.h"
#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/cpu/cpu_tensor_access.h"
#include "model/ops/llama_math.h"

namespace gpt {

using namespace cpu;

namespace {

constexpr int64_t kParallelElems = 1 << 14;  // smaller problems are not worth waking the thread pool for

// One row: y = x * rstd * gamma; returns rstd.
GPT_CPU_KERNEL float rmsnorm_row(const float* xr, const float* gp, float* yr, int64_t C, float eps) {
  float sq = 0.f;
#pragma omp simd reduction(+ : sq)
  for (int64_t c = 0; c < C; ++c) sq += xr[c] * xr[c];
  const float rs = 1.f / std::sqrt(sq / C + eps);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * rs * gp[c];
  return rs;
}

// One row: dx, and this thread's partial dgamma sums (pg).
GPT_CPU_KERNEL void rmsnorm_backward_row(const float* dyr, const float* xr, const float* gp, float rs, float* dxr,
                                         float* pg, int64_t C) {
  float sum_gx = 0.f;
#pragma omp simd reduction(+ : sum_gx)
  for (int64_t c = 0; c < C; ++c) sum_gx += dyr[c] * gp[c] * xr[c] * rs;
  const float mean_gx = sum_gx / C;
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const float xhat = xr[c] * rs;
    dxr[c] = rs * (dyr[c] * gp[c] - xhat * mean_gx);
    pg[c] += dyr[c] * xhat;
  }
}

GPT_CPU_KERNEL void swiglu_row(const float* gate, const float* up, float* yr, int64_t F) {
#pragma omp simd
  for (int64_t f = 0; f < F; ++f) {
    const float sig = 1.f / (1.f + fast_exp(-gate[f]));
    yr[f] = ops::swiglu_value(gate[f], up[f], sig);
  }
}

GPT_CPU_KERNEL void swiglu_backward_row(const float* dyr, const float* gate, const float* up, float* dgate, float* dup,
                                        int64_t F) {
#pragma omp simd
  for (int64_t f = 0; f < F; ++f) {
    const float sig = 1.f / (1.f + fast_exp(-gate[f]));
    ops::swiglu_grad(dyr[f], gate[f], up[f], sig, dgate[f], dup[f]);
  }
}

// Rotates the first R dims of each of `heads` heads (D apart) of one row by the angles whose cos and sin
// are given (R/2 of each; sin negated for the backward pass).
GPT_CPU_KERNEL void rope_row(float* row, int64_t heads, int64_t D, int64_t R, const float* cs, const float* sn) {
  const int64_t half = R / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* x = row + h * D;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) ops::rope_rotate(x[i], x[i + half], cs[i], sn[i]);
  }
}

// rope_forward (sign +1) and rope_backward (sign -1: the transpose rotation) on qkv, in place.
void rope(Tensor& qkv, const ops::RopeDims& d, float base, int64_t pos0, float sign) {
  const int64_t half = d.R / 2, width = d.heads() * d.D, ld = d.ld();
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = ops::rope_inv_freq(i, d.R, base);
#pragma omp parallel if (d.rows() * width > kParallelElems)
  {
    std::vector<float> cs(half), sn(half);
    Windows w;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < d.rows(); ++n) {
      const int64_t pos = pos0 + n % d.T;
      for (int64_t i = 0; i < half; ++i) {
        ops::rope_cos_sin(pos, inv_freq[i], cs[i], sn[i]);
        sn[i] *= sign;
      }
      // The q and k heads of a row are contiguous: one window over them, the v part untouched.
      rope_row(w.out(0, qkv, n * ld, width, true), d.heads(), d.D, d.R, cs.data(), sn.data());
      w.store(0, qkv, n * ld, width);
    }
  }
}

}  // namespace

void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd, float eps) {
  const char* op = "rmsnorm_forward";
  const auto [N, C] = ops::check_rmsnorm(kChecks, x, gamma, y, rstd, op);
  F32Input gf(gamma, op, "gamma");
  const float* gp = gf.get();
  float* rp = rstd.f32();
#pragma omp parallel if (N * C > kParallelElems)
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      rp[n] = rmsnorm_row(w.in(0, x, n * C, C), gp, w.out(1, y, n * C, C), C, eps);
      w.store(1, y, n * C, C);
    }
  }
}

void CpuBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                  Tensor& dx, Tensor& dgamma) {
  const char* op = "rmsnorm_backward";
  const auto [N, C] = ops::check_rmsnorm_backward(kChecks, dy, x, gamma, rstd, dx, dgamma, op);
  F32Input gf(gamma, op, "gamma");
  const float *gp = gf.get(), *rp = rstd.f32();
  float* dgp = dgamma.f32();
  rows_with_partial_sums(
      N, C, kParallelElems,
      [&](Windows& w, int64_t n, float* partial) {
        rmsnorm_backward_row(w.in(0, dy, n * C, C), w.in(1, x, n * C, C), gp, rp[n], w.out(2, dx, n * C, C), partial,
                             C);
        w.store(2, dx, n * C, C);
      },
      [&](const float* partial) {
        for (int64_t c = 0; c < C; ++c) dgp[c] += partial[c];
      });
}

void CpuBackend::swiglu_forward(const Tensor& x, Tensor& y) {
  const char* op = "swiglu_forward";
  const auto [N, F] = ops::check_swiglu(kChecks, x, y, "y", op);
#pragma omp parallel if (N * F > kParallelElems)
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = w.in(0, x, n * 2 * F, 2 * F);
      swiglu_row(xr, xr + F, w.out(1, y, n * F, F), F);
      w.store(1, y, n * F, F);
    }
  }
}

void CpuBackend::swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "swiglu_backward";
  const auto [N, F] = ops::check_swiglu_backward(kChecks, dy, x, dx, op);
#pragma omp parallel if (N * F > kParallelElems)
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = w.in(0, x, n * 2 * F, 2 * F);
      float* dxr = w.out(2, dx, n * 2 * F, 2 * F);
      swiglu_backward_row(w.in(1, dy, n * F, F), xr, xr + F, dxr, dxr + F, F);
      w.store(2, dx, n * 2 * F, 2 * F);
    }
  }
}

void CpuBackend::rope_forward(Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, int64_t rotary_dims,
                              float base, int64_t pos0) {
  rope(qkv, ops::check_rope(kChecks, qkv, B, T, H, G, D, rotary_dims, base, pos0, "rope_forward", "qkv"), base, pos0,
       1.f);
}

void CpuBackend::rope_backward(Tensor& dqkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                               int64_t rotary_dims, float base, int64_t pos0) {
  rope(dqkv, ops::check_rope(kChecks, dqkv, B, T, H, G, D, rotary_dims, base, pos0, "rope_backward", "dqkv"), base,
       pos0, -1.f);
}

}  // namespace gpt
