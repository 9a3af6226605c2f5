// Optimizer kernels on the CPU: the fp64 sum of squares behind gradient-norm clipping, and the decoupled
// AdamW update on fp32 master weights and moments. The sum is taken per thread over fixed contiguous
// chunks and the partials are added in thread order, so the global norm is reproducible run to run.
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

GPT_CPU_KERNEL void adamw_chunk(float* wp, const float* gp, float* mp, float* vp, int64_t n, float lr, float beta1,
                                float beta2, float eps, float weight_decay, float inv_bc1, float inv_bc2) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    ops::adamw_update(wp[i], gp[i], mp[i], vp[i], lr, beta1, beta2, eps, weight_decay, inv_bc1, inv_bc2);
}

}  // namespace

double CpuBackend::sum_squares(const Tensor& t) {
  F32Input tf(t, "sum_squares", "t");
  const float* p = tf.get();
  const int64_t n = t.numel();
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

}  // namespace gpt
