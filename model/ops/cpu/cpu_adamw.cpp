// Optimizer kernels on the CPU: the fp64 sum of squares behind gradient-norm clipping (of one tensor, or of
// every segment of a flat buffer into per-parameter slots), and the decoupled AdamW update on fp32 master
// weights and moments (of one tensor, or of a flat buffer's segments with the gradient scaling and the
// rounded copy into the compute-dtype weights fused in). A sum is taken per thread over fixed contiguous
// chunks and the partials are added in thread order, so the global norm is reproducible run to run.
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/ops/adamw_update.h"
#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_dispatch.h"
#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {

using namespace cpu;

namespace {

GPT_CPU_KERNEL double sum_squares_chunk(const float* p, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(p[i]) * p[i];
  return acc;
}

// Sum of p[i]^2 over [0, n) in fp64: one contiguous chunk per thread, partials added in thread order.
double sum_squares_f32(const float* p, int64_t n) {
  const int nt = threads_for(n, 1 << 15);
  std::vector<double> partial(nt, 0.0);
  int used = 1;
#pragma omp parallel num_threads(nt)
  {
#pragma omp single
    used = omp_get_num_threads();
    int64_t lo, hi;
    chunk_range(n, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
    partial[omp_get_thread_num()] = sum_squares_chunk(p + lo, hi - lo);
  }
  double total = 0.0;
  for (int i = 0; i < used; ++i) total += partial[i];
  return total;
}

GPT_CPU_KERNEL void adamw_chunk(float* wp, const float* gp, float* mp, float* vp, int64_t n, float lr, float beta1,
                                float beta2, float eps, float weight_decay, float inv_bc1, float inv_bc2) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    ops::adamw_update(wp[i], gp[i], mp[i], vp[i], lr, beta1, beta2, eps, weight_decay, inv_bc1, inv_bc2);
}

// adamw_chunk with every gradient multiplied by grad_scale first (the fp32 product a scaling pass stores).
GPT_CPU_KERNEL void adamw_scaled_chunk(float* wp, const float* gp, float* mp, float* vp, int64_t n, float grad_scale,
                                       float lr, float beta1, float beta2, float eps, float weight_decay,
                                       float inv_bc1, float inv_bc2) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = gp[i] * grad_scale;
    ops::adamw_update(wp[i], g, mp[i], vp[i], lr, beta1, beta2, eps, weight_decay, inv_bc1, inv_bc2);
  }
}

}  // namespace

double CpuBackend::sum_squares(const Tensor& t) {
  F32Input tf(t, "sum_squares", "t");
  return sum_squares_f32(tf.get(), t.numel());
}

void CpuBackend::sum_squares_segments(const Tensor& flat, const std::vector<ops::FlatSegment>& segments,
                                      Tensor& sums) {
  const char* op = "sum_squares_segments";
  require_dtype(flat, DType::F32, op, "flat");
  require_dtype(sums, DType::F64, op, "sums");
  ops::check_flat_segments(kChecks, segments, flat.numel(), sums.numel(), op);
  double* out = sums.data<double>();
  // Segment by segment, each exactly as sum_squares sums a tensor of its own.
  for (const ops::FlatSegment& s : segments)
    if (s.norm_slot >= 0) out[s.norm_slot] += sum_squares_f32(flat.f32() + s.begin, s.end - s.begin);
}

void CpuBackend::adamw_step(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                            float eps, float weight_decay, int64_t step) {
  const ops::AdamWBiasCorrections bc = ops::check_adamw(kChecks, w, g, m, v, beta1, beta2, step, "adamw_step");
  float *wp = w.f32(), *mp = m.f32(), *vp = v.f32();
  const float* gp = g.f32();
  const int64_t n = w.numel();
  for_each_chunk(n, 1 << 15, [&](int64_t lo, int64_t hi) {
    adamw_chunk(wp + lo, gp + lo, mp + lo, vp + lo, hi - lo, lr, beta1, beta2, eps, weight_decay, bc.inv_bc1, bc.inv_bc2);
  });
}

void CpuBackend::adamw_step_flat(Tensor& master, const Tensor& grad, Tensor& m, Tensor& v, Tensor* value,
                                 const std::vector<ops::FlatSegment>& segments, const ops::AdamWHyper& h) {
  const ops::AdamWBiasCorrections bc =
      ops::check_adamw_flat(kChecks, master, grad, m, v, value, segments, h, "adamw_step_flat");
  if (segments.empty()) return;
  float *wp = master.f32(), *mp = m.f32(), *vp = v.f32();
  const float* gp = grad.f32();
  char* value_bytes = value ? static_cast<char*>(value->raw()) : nullptr;
  const size_t value_esize = value ? dtype_size(value->dtype()) : 0;
  // The threads split the whole buffer into equal chunks; a chunk walks the segments it overlaps.
  for_each_chunk(segments.back().end, 1 << 15, [&](int64_t lo, int64_t hi) {
    auto s = std::upper_bound(segments.begin(), segments.end(), lo,
                              [](int64_t x, const ops::FlatSegment& seg) { return x < seg.end; });
    for (; s != segments.end() && s->begin < hi; ++s) {
      const int64_t a = std::max(lo, s->begin), b = std::min(hi, s->end);
      if (a >= b) continue;
      adamw_scaled_chunk(wp + a, gp + a, mp + a, vp + a, b - a, h.grad_scale, h.lr, h.beta1, h.beta2, h.eps,
                         s->weight_decay, bc.inv_bc1, bc.inv_bc2);
      if (value_bytes) from_f32(wp + a, value_bytes + a * value_esize, value->dtype(), b - a);
    }
  });
}

}  // namespace gpt
