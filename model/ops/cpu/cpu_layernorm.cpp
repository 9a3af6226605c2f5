// LayerNorm over the last dimension on the CPU, one row per loop iteration (a bf16 row is converted into
// the thread's fp32 window, cpu_tensor_access.h, and the result rounded back once). The backward pass uses the
// standard closed form dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma; gamma and
// beta gradients are summed per thread over a fixed block of rows and the partial sums are then added in
// thread order, which keeps the result reproducible.
#include <cmath>
#include <vector>

#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_dispatch.h"
#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {

using namespace cpu;

namespace {

// One row: y = (x - mean) * rstd * gamma + beta; returns mean and rstd.
GPT_CPU_KERNEL void layernorm_row(const float* xr, const float* gp, const float* bp, float* yr, int64_t C, float eps,
                                  float* mean, float* rstd) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < C; ++c) sum += xr[c];
  const float mu = sum / C;
  float sq = 0.f;
#pragma omp simd reduction(+ : sq)
  for (int64_t c = 0; c < C; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
  const float rs = 1.f / std::sqrt(sq / C + eps);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs * gp[c] + bp[c];
  *mean = mu;
  *rstd = rs;
}

// One row: dx, and this thread's partial dgamma (pg) and dbeta (pb) sums.
GPT_CPU_KERNEL void layernorm_backward_row(const float* dyr, const float* xr, const float* gp, float mu, float rs,
                                           float* dxr, float* pg, float* pb, int64_t C) {
  float sum_g = 0.f, sum_gx = 0.f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t c = 0; c < C; ++c) {
    const float xhat = (xr[c] - mu) * rs;
    const float g = dyr[c] * gp[c];
    sum_g += g;
    sum_gx += g * xhat;
  }
  const float mean_g = sum_g / C, mean_gx = sum_gx / C;
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const float xhat = (xr[c] - mu) * rs;
    dxr[c] = rs * (dyr[c] * gp[c] - mean_g - xhat * mean_gx);
    pg[c] += dyr[c] * xhat;
    pb[c] += dyr[c];
  }
}

}  // namespace

void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                   Tensor& mean, Tensor& rstd, float eps) {
  const char* op = "layernorm_forward";
  const int64_t C = gamma.numel();
  const int64_t N = ops::check_layernorm_rows(kChecks, x, C, op);
  require_numel(beta, C, op, "beta", "gamma's shape");
  require_numel(y, N * C, op, "y", "x's shape " + shape_str(x.shape()));
  require_dtype(mean, DType::F32, op, "mean");
  require_dtype(rstd, DType::F32, op, "rstd");
  require_numel(mean, N, op, "mean", "one value per row");
  require_numel(rstd, N, op, "rstd", "one value per row");
  require_float(y, op, "y");
  F32Input gf(gamma, op, "gamma"), bf(beta, op, "beta");
  const float *gp = gf.get(), *bp = bf.get();
  float *mp = mean.f32(), *rp = rstd.f32();
#pragma omp parallel if (N * C > (1 << 14))
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      layernorm_row(w.in(0, x, n * C, C), gp, bp, w.out(1, y, n * C, C), C, eps, mp + n, rp + n);
      w.store(1, y, n * C, C);
    }
  }
}

void CpuBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                    const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const char* op = "layernorm_backward";
  const int64_t C = gamma.numel();
  const int64_t N = ops::check_layernorm_rows(kChecks, x, C, op);
  ops::check_layernorm_backward(kChecks, dy, x, mean, rstd, dx, dgamma, dbeta, N, C, op);
  F32Input gf(gamma, op, "gamma");
  F32Output dgf(dgamma, true, op, "dgamma"), dbf(dbeta, true, op, "dbeta");
  const float *gp = gf.get(), *mp = mean.f32(), *rp = rstd.f32();

  float *dgp = dgf.get(), *dbp = dbf.get();
  // Per-thread partial sums: [0..C) for dgamma, [C..2C) for dbeta.
  rows_with_partial_sums(
      N, 2 * C, 1 << 14,
      [&](Windows& w, int64_t n, float* partial) {
        layernorm_backward_row(w.in(0, dy, n * C, C), w.in(1, x, n * C, C), gp, mp[n], rp[n], w.out(2, dx, n * C, C),
                               partial, partial + C, C);
        w.store(2, dx, n * C, C);
      },
      [&](const float* partial) {
        for (int64_t c = 0; c < C; ++c) {
          dgp[c] += partial[c];
          dbp[c] += partial[C + c];
        }
      });
  dgf.commit();
  dbf.commit();
}

}  // namespace gpt
