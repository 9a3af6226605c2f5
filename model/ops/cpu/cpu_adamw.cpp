// Optimizer kernels on the CPU: the fp64 sum of squares behind gradient-norm clipping, and the decoupled
// AdamW update on fp32 master weights and moments. The sum is taken per thread over fixed contiguous
// chunks and the partials are added in thread order, so the global norm is reproducible run to run.
#include <cmath>
#include <vector>

#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {

using namespace cpu;

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
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = lo; i < hi; ++i) acc += static_cast<double>(p[i]) * p[i];
    partial[omp_get_thread_num()] = acc;
  }
  double total = 0.0;
  for (int i = 0; i < used; ++i) total += partial[i];
  return total;
}

void CpuBackend::adamw_step(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                            float eps, float weight_decay, int64_t step) {
  const char* op = "adamw_step";
  require_dtype(w, DType::F32, op, "w (fp32 master weights)");
  require_dtype(g, DType::F32, op, "g");
  require_dtype(m, DType::F32, op, "m");
  require_dtype(v, DType::F32, op, "v");
  const std::string wshape = "w's shape " + shape_str(w.shape());
  require_numel(g, w.numel(), op, "g", wshape);
  require_numel(m, w.numel(), op, "m", wshape);
  require_numel(v, w.numel(), op, "v", wshape);
  require(step >= 1, op, "step is 1-based, got " + std::to_string(step));
  // Bias corrections in double: beta^step underflows gracefully and 1 - beta^step keeps its precision.
  const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), step)));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), step)));
  float *wp = w.f32(), *mp = m.f32(), *vp = v.f32();
  const float* gp = g.f32();
  const int64_t n = w.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const float gi = gp[i];
    const float mi = beta1 * mp[i] + (1.f - beta1) * gi;
    const float vi = beta2 * vp[i] + (1.f - beta2) * gi * gi;
    mp[i] = mi;
    vp[i] = vi;
    const float update = (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps) + weight_decay * wp[i];
    wp[i] -= lr * update;
  }
}

}  // namespace gpt
