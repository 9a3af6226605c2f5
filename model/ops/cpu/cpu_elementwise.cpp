// Element-wise CPU kernels: tanh-approximated GELU and its derivative, the residual add / accumulate, and
// in-place scaling. Each walks the elements in pieces over the OpenMP threads (for_each_window), so a
// bf16 tensor is converted one cached piece at a time; the loops are vectorised by the compiler (tanh
// comes from fast_tanh in cpu_math.h, which vectorises where std::tanh does not).
#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_dispatch.h"
#include "model/ops/cpu/cpu_math.h"
#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {

using namespace cpu;

namespace {

// Small tensors are not worth waking the thread pool for.
constexpr int64_t kParallelElems = 1 << 15;
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

// GELU (tanh form) of n values, and its backward: dx = dy * gelu'(x).
GPT_CPU_KERNEL void gelu_chunk(const float* xp, float* yp, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = xp[i];
    const float t = fast_tanh(kGeluK * (v + kGeluC * v * v * v));
    yp[i] = 0.5f * v * (1.f + t);
  }
}

GPT_CPU_KERNEL void gelu_backward_chunk(const float* xp, const float* dyp, float* dxp, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = xp[i];
    const float t = fast_tanh(kGeluK * (v + kGeluC * v * v * v));
    const float dinner = kGeluK * (1.f + 3.f * kGeluC * v * v);
    dxp[i] = dyp[i] * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * dinner);
  }
}

// out = a + b over n values (out may be a or b).
GPT_CPU_KERNEL void add_chunk(const float* ap, const float* bp, float* outp, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) outp[i] = ap[i] + bp[i];
}

}  // namespace

void CpuBackend::gelu_forward(const Tensor& x, Tensor& y) {
  const char* op = "gelu_forward";
  ops::check_elementwise(kChecks, op, {{x, "x"}, {y, "y"}});
  for_each_window(x.numel(), kParallelElems, [&](Windows& w, int64_t lo, int64_t len) {
    gelu_chunk(w.in(0, x, lo, len), w.out(1, y, lo, len), len);
    w.store(1, y, lo, len);
  });
}

void CpuBackend::gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "gelu_backward";
  ops::check_elementwise(kChecks, op, {{x, "x"}, {dy, "dy"}, {dx, "dx"}});
  for_each_window(x.numel(), kParallelElems, [&](Windows& w, int64_t lo, int64_t len) {
    gelu_backward_chunk(w.in(0, x, lo, len), w.in(1, dy, lo, len), w.out(2, dx, lo, len), len);
    w.store(2, dx, lo, len);
  });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  ops::check_elementwise(kChecks, op, {{a, "a"}, {b, "b"}, {out, "out"}});
  for_each_window(a.numel(), kParallelElems, [&](Windows& w, int64_t lo, int64_t len) {
    add_chunk(w.in(0, a, lo, len), w.in(1, b, lo, len), w.out(2, out, lo, len), len);
    w.store(2, out, lo, len);
  });
}

void CpuBackend::accumulate(const Tensor& src, Tensor& dst) {
  const char* op = "accumulate";
  ops::check_elementwise(kChecks, op, {{src, "src"}, {dst, "dst"}});
  for_each_window(src.numel(), kParallelElems, [&](Windows& w, int64_t lo, int64_t len) {
    float* dp = w.out(1, dst, lo, len, true);
    add_chunk(dp, w.in(0, src, lo, len), dp, len);
    w.store(1, dst, lo, len);
  });
}

void CpuBackend::scale(Tensor& t, float alpha) {
  require_float(t, "scale", "t");
  for_each_window(t.numel(), kParallelElems, [&](Windows& w, int64_t lo, int64_t len) {
    float* p = w.out(0, t, lo, len, true);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) p[i] *= alpha;
    w.store(0, t, lo, len);
  });
}

}  // namespace gpt
