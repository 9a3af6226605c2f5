// Element-wise CPU kernels: tanh-approximated GELU and its derivative, the residual add / accumulate, and
// in-place scaling. Each is one flat OpenMP loop over the elements that the compiler vectorises (tanh
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

void require_same_numel(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  require(a.numel() == b.numel(), op,
          std::string(an) + " " + describe(a) + " and " + bn + " " + describe(b) + " differ in element count");
}

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

}  // namespace

void CpuBackend::gelu_forward(const Tensor& x, Tensor& y) {
  const char* op = "gelu_forward";
  require_float(x, op, "x");
  require_same_numel(x, y, op, "x", "y");
  F32Input xf(x, op, "x");
  F32Output yf(y, false, op, "y");
  const float* xp = xf.get();
  float* yp = yf.get();
  const int64_t n = x.numel();
  for_each_chunk(n, kParallelElems, [&](int64_t lo, int64_t hi) { gelu_chunk(xp + lo, yp + lo, hi - lo); });
  yf.commit();
}

void CpuBackend::gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "gelu_backward";
  require_float(x, op, "x");
  require_same_numel(x, dy, op, "x", "dy");
  require_same_numel(x, dx, op, "x", "dx");
  F32Input xf(x, op, "x"), dyf(dy, op, "dy");
  F32Output dxf(dx, false, op, "dx");
  const float *xp = xf.get(), *dyp = dyf.get();
  float* dxp = dxf.get();
  const int64_t n = x.numel();
  for_each_chunk(n, kParallelElems,
                 [&](int64_t lo, int64_t hi) { gelu_backward_chunk(xp + lo, dyp + lo, dxp + lo, hi - lo); });
  dxf.commit();
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  require_float(a, op, "a");
  require_same_numel(a, b, op, "a", "b");
  require_same_numel(a, out, op, "a", "out");
  F32Input af(a, op, "a"), bf(b, op, "b");
  F32Output of(out, false, op, "out");
  const float *ap = af.get(), *bp = bf.get();
  float* op_ = of.get();
  const int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) op_[i] = ap[i] + bp[i];
  of.commit();
}

void CpuBackend::accumulate(const Tensor& src, Tensor& dst) {
  const char* op = "accumulate";
  require_float(src, op, "src");
  require_same_numel(src, dst, op, "src", "dst");
  F32Input sf(src, op, "src");
  F32Output df(dst, true, op, "dst");
  const float* sp = sf.get();
  float* dp = df.get();
  const int64_t n = src.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) dp[i] += sp[i];
  df.commit();
}

void CpuBackend::scale(Tensor& t, float alpha) {
  F32Output tf(t, true, "scale", "t");
  float* p = tf.get();
  const int64_t n = t.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
  tf.commit();
}

}  // namespace gpt
