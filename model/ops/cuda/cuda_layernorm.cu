// LayerNorm over the last dimension on the GPU. Forward and the input gradient use one warp per row
// (mean, then variance around it, then the normalised output; statistics in fp32):
//   y = (x - mean) * rstd * gamma + beta,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma, xhat = (x - mean) * rstd.
// The gamma and beta gradients are column sums over rows, taken like the bias gradient: fp32 partial sums
// per chunk of 64 rows, then added chunk by chunk in order (reproducible, no atomics).
// Where the activations share one dtype T and gamma and beta one dtype W (T or fp32), kernels compiled for
// (T, W) read whole 16-byte chunks when the width and addresses allow (cuda_half.cuh), else single
// elements; other mixes take the generic kernels, which convert each element by its dtype.
// The residual add before a LayerNorm (a block's second one, the next block's first, the final one) runs
// in the forward kernel (h = x + r is written, rounded to its dtype, and normalised as read back), and the
// residual's gradient in the dx kernel (dx = LN'(dy), rounded, + dres), saving a pass over the rows each. With r and dres of the activations'
// dtype and every tensor 16-byte aligned (as the model's are) both pick the kernel the separate add then
// LayerNorm (LayerNorm then accumulate) would, and give the same bits; a mix of dtypes or an unaligned view
// can pick another chunk width, whose sums differ from the separate ops' in the last bits.
#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_half.cuh"
#include "model/ops/cuda/cuda_launch.h"
#include "model/ops/cuda/cuda_reduce.cuh"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kRowsPerBlock = kWarpRowsPerBlock;  // one warp per row (cuda_check.h)

struct LnTensors {
  const void* x;
  DType xd;
  const void* gamma;
  DType gd;
};

// Rows of x [N, C] -> y, mean[N], rstd[N]. Block = 8 warps, one row each. With r non-null the rows are
// h = x + r, written to h (x's dtype) and normalised as stored.
__global__ void layernorm_forward_kernel(LnTensors in, const void* r, DType rd, void* h, const void* beta, DType bd,
                                         void* y, DType yd, float* mean, float* rstd, int64_t N, int64_t C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;  // the whole warp leaves together
  const int64_t base = row * C;
  const void* src = r ? h : in.x;  // each lane reads back only the columns it wrote
  float s = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    if (r) store_from_f32(h, in.xd, base + c, load_as_f32(in.x, in.xd, base + c) + load_as_f32(r, rd, base + c));
    s += load_as_f32(src, in.xd, base + c);
  }
  const float mu = warp_sum(s) / static_cast<float>(C);
  float q = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = load_as_f32(src, in.xd, base + c) - mu;
    q += d * d;
  }
  const float rs = 1.f / sqrtf(warp_sum(q) / static_cast<float>(C) + eps);
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (load_as_f32(src, in.xd, base + c) - mu) * rs;
    store_from_f32(y, yd, base + c, xhat * load_as_f32(in.gamma, in.gd, c) + load_as_f32(beta, bd, c));
  }
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// dx for each row; same block shape as the forward. With dres non-null, dx = round(LN'(dy)) + dres.
__global__ void layernorm_dx_kernel(LnTensors in, const void* dy, DType dyd, const float* mean, const float* rstd,
                                    const void* dres, DType rd, void* dx, DType dxd, int64_t N, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int64_t base = row * C;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.f, sum_gx = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (load_as_f32(in.x, in.xd, base + c) - mu) * rs;
    const float g = load_as_f32(dy, dyd, base + c) * load_as_f32(in.gamma, in.gd, c);
    sum_g += g;
    sum_gx += g * xhat;
  }
  const float mean_g = warp_sum(sum_g) / static_cast<float>(C);
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (load_as_f32(in.x, in.xd, base + c) - mu) * rs;
    const float g = load_as_f32(dy, dyd, base + c) * load_as_f32(in.gamma, in.gd, c);
    const float v = rs * (g - mean_g - xhat * mean_gx);
    if (dres) {  // the separate ops' rounding, then the residual's add (dres read first: it may be dx)
      const float res = load_as_f32(dres, rd, base + c);
      store_from_f32(dx, dxd, base + c, v);
      store_from_f32(dx, dxd, base + c, __fadd_rn(load_as_f32(dx, dxd, base + c), res));  // never an FMA
    } else {
      store_from_f32(dx, dxd, base + c, v);
    }
  }
}

// The forward kernel for activations of dtype T and parameters of dtype W, lanes taking chunks of V
// columns (the generic kernel's arithmetic, element for element).
template <class T, class W, int V>
__global__ void layernorm_forward_typed_kernel(const T* x, const T* r, T* h, const W* gamma, const W* beta, T* y,
                                               float* mean, float* rstd, int64_t N, int64_t C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int64_t base = row * C;
  const T* src = r ? h : x;
  float s = 0.f;
  for (int64_t c = int64_t(lane) * V; c < C; c += 32 * V) {
    float v[V];
    load_chunk<V>(x + base + c, v);
    if (r) {
      float q[V];
      load_chunk<V>(r + base + c, q);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = v[i] + q[i];
      store_chunk<V>(h + base + c, v);
      load_chunk<V>(h + base + c, v);  // normalised as stored (16-bit: rounded; fp32: the same value)
    }
#pragma unroll
    for (int i = 0; i < V; ++i) s += v[i];
  }
  const float mu = warp_sum(s) / static_cast<float>(C);
  float q = 0.f;
  for (int64_t c = int64_t(lane) * V; c < C; c += 32 * V) {
    float v[V];
    load_chunk<V>(src + base + c, v);
#pragma unroll
    for (int i = 0; i < V; ++i) q += (v[i] - mu) * (v[i] - mu);
  }
  const float rs = 1.f / sqrtf(warp_sum(q) / static_cast<float>(C) + eps);
  for (int64_t c = int64_t(lane) * V; c < C; c += 32 * V) {
    float v[V], g[V], b[V];
    load_chunk<V>(src + base + c, v);
    load_chunk<V>(gamma + c, g);
    load_chunk<V>(beta + c, b);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = (v[i] - mu) * rs * g[i] + b[i];
    store_chunk<V>(y + base + c, v);
  }
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// The dx kernel for activations of dtype T and gamma of dtype W, in chunks of V columns; dres optional.
template <class T, class W, int V>
__global__ void layernorm_dx_typed_kernel(const T* x, const W* gamma, const T* dy, const float* mean,
                                          const float* rstd, const T* dres, T* dx, int64_t N, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int64_t base = row * C;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.f, sum_gx = 0.f;
  for (int64_t c = int64_t(lane) * V; c < C; c += 32 * V) {
    float v[V], g[V], d[V];
    load_chunk<V>(x + base + c, v);
    load_chunk<V>(gamma + c, g);
    load_chunk<V>(dy + base + c, d);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float gi = d[i] * g[i];
      sum_g += gi;
      sum_gx += gi * ((v[i] - mu) * rs);
    }
  }
  const float mean_g = warp_sum(sum_g) / static_cast<float>(C);
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);
  for (int64_t c = int64_t(lane) * V; c < C; c += 32 * V) {
    float v[V], g[V], d[V], out[V];
    load_chunk<V>(x + base + c, v);
    load_chunk<V>(gamma + c, g);
    load_chunk<V>(dy + base + c, d);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = rs * (d[i] * g[i] - mean_g - ((v[i] - mu) * rs) * mean_gx);
    if (dres) {  // the separate ops' rounding, then the residual's add (dres read first: it may be dx)
      float res[V];
      load_chunk<V>(dres + base + c, res);
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = __fadd_rn(to_f32(from_f32<T>(out[i])), res[i]);
    }
    store_chunk<V>(dx + base + c, out);
  }
}

// Per chunk k of 64 rows: pg[k, c] = sum dy * xhat, pb[k, c] = sum dy. Grid (ceil(C / 32), chunks),
// block (32, 8).
__global__ void layernorm_param_partials_kernel(const void* x, DType xd, const void* dy, DType dyd, const float* mean,
                                                const float* rstd, int64_t N, int64_t C, float* pg, float* pb) {
  __shared__ float acc_g[8][33], acc_b[8][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * kColumnSumRowsPerChunk;
  const int64_t r1 = min(N, r0 + kColumnSumRowsPerChunk);
  float sg = 0.f, sb = 0.f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float d = load_as_f32(dy, dyd, r * C + c);
      sg += d * (load_as_f32(x, xd, r * C + c) - mean[r]) * rstd[r];
      sb += d;
    }
  }
  acc_g[threadIdx.y][threadIdx.x] = sg;
  acc_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tg = 0.f, tb = 0.f;
    for (int y = 0; y < 8; ++y) {
      tg += acc_g[y][threadIdx.x];
      tb += acc_b[y][threadIdx.x];
    }
    pg[int64_t(blockIdx.y) * C + c] = tg;
    pb[int64_t(blockIdx.y) * C + c] = tb;
  }
}

}  // namespace

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean,
                                    Tensor& rstd, float eps) {
  layernorm_forward_impl(x, nullptr, nullptr, gamma, beta, y, mean, rstd, eps, "layernorm_forward");
}

void CudaBackend::add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                        Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, float eps) {
  const char* op = "add_layernorm_forward";
  ops::check_add_norm(kChecks, x, r, h, op);
  layernorm_forward_impl(x, &r, &h, gamma, beta, y, mean, rstd, eps, op);
}

void CudaBackend::layernorm_forward_impl(const Tensor& x, const Tensor* r, Tensor* h, const Tensor& gamma,
                                         const Tensor& beta, Tensor& y, Tensor& mean, Tensor& rstd, float eps,
                                         const char* op) {
  require_float(gamma, op, "gamma");
  require_float(beta, op, "beta");
  const int64_t C = gamma.numel();
  const int64_t N = ops::check_layernorm_rows(kChecks, x, C, op);
  require_numel(beta, C, op, "beta", "gamma's shape");
  require_float(y, op, "y");
  require_numel(y, N * C, op, "y", "x's shape " + shape_str(x.shape()));
  require_dtype(mean, DType::F32, op, "mean");
  require_dtype(rstd, DType::F32, op, "rstd");
  require_numel(mean, N, op, "mean", "one value per row");
  require_numel(rstd, N, op, "rstd", "one value per row");
  if (N == 0) return;
  const unsigned row_grid = warp_row_blocks(N, op);
  const DType t = x.dtype();
  const bool typed = y.dtype() == t && (!r || r->dtype() == t) && beta.dtype() == gamma.dtype() &&
                     (gamma.dtype() == t || gamma.dtype() == DType::F32);
  if (typed) {
    with_row_kernel(x, gamma, C, {x.raw(), y.raw(), r ? r->raw() : nullptr, h ? h->raw() : nullptr},
                    {gamma.raw(), beta.raw()}, [&](auto tt, auto ww, auto v) {
                      using T = decltype(tt);
                      using W = decltype(ww);
                      layernorm_forward_typed_kernel<T, W, decltype(v)::value>
                          <<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
                              static_cast<const T*>(x.raw()), r ? static_cast<const T*>(r->raw()) : nullptr,
                              h ? static_cast<T*>(h->raw()) : nullptr, static_cast<const W*>(gamma.raw()),
                              static_cast<const W*>(beta.raw()), static_cast<T*>(y.raw()), mean.f32(), rstd.f32(), N,
                              C, eps);
                    });
  } else {
    layernorm_forward_kernel<<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
        {x.raw(), x.dtype(), gamma.raw(), gamma.dtype()}, r ? r->raw() : nullptr, r ? r->dtype() : x.dtype(),
        h ? h->raw() : nullptr, beta.raw(), beta.dtype(), y.raw(), y.dtype(), mean.f32(), rstd.f32(), N, C, eps);
  }
  check_launch(op);
}

void CudaBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  layernorm_backward_impl(dy, x, gamma, mean, rstd, nullptr, dx, dgamma, dbeta, "layernorm_backward");
}

void CudaBackend::layernorm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                         const Tensor& rstd, const Tensor& dres, Tensor& dx, Tensor& dgamma,
                                         Tensor& dbeta) {
  const char* op = "layernorm_backward_add";
  require_float(dres, op, "dres");
  require_numel(dres, x.numel(), op, "dres", "x's shape " + shape_str(x.shape()));
  layernorm_backward_impl(dy, x, gamma, mean, rstd, &dres, dx, dgamma, dbeta, op);
}

void CudaBackend::layernorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                          const Tensor& rstd, const Tensor* dres, Tensor& dx, Tensor& dgamma,
                                          Tensor& dbeta, const char* op) {
  require_float(gamma, op, "gamma");
  const int64_t C = gamma.numel();
  const int64_t N = ops::check_layernorm_rows(kChecks, x, C, op);
  ops::check_layernorm_backward(kChecks, dy, x, mean, rstd, dx, dgamma, dbeta, N, C, op);
  if (N == 0) return;
  const unsigned row_grid = warp_row_blocks(N, op);
  const int64_t chunks = column_sum_chunks(N, op);
  const DType t = x.dtype();
  const bool typed = dy.dtype() == t && dx.dtype() == t && (!dres || dres->dtype() == t) &&
                     (gamma.dtype() == t || gamma.dtype() == DType::F32);
  if (typed) {
    with_row_kernel(x, gamma, C, {x.raw(), dy.raw(), dx.raw(), dres ? dres->raw() : nullptr}, {gamma.raw()},
                    [&](auto tt, auto ww, auto v) {
                      using T = decltype(tt);
                      using W = decltype(ww);
                      layernorm_dx_typed_kernel<T, W, decltype(v)::value>
                          <<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
                              static_cast<const T*>(x.raw()), static_cast<const W*>(gamma.raw()),
                              static_cast<const T*>(dy.raw()), mean.f32(), rstd.f32(),
                              dres ? static_cast<const T*>(dres->raw()) : nullptr, static_cast<T*>(dx.raw()), N, C);
                    });
  } else {
    const LnTensors in{x.raw(), x.dtype(), gamma.raw(), gamma.dtype()};
    layernorm_dx_kernel<<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
        in, dy.raw(), dy.dtype(), mean.f32(), rstd.f32(), dres ? dres->raw() : nullptr,
        dres ? dres->dtype() : dx.dtype(), dx.raw(), dx.dtype(), N, C);
  }
  check_launch(op);
  Tensor partials = empty({2, chunks, C});
  float* pg = partials.f32();
  float* pb = pg + chunks * C;
  dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
  layernorm_param_partials_kernel<<<grid, dim3(32, 8), 0, stream_>>>(x.raw(), x.dtype(), dy.raw(), dy.dtype(),
                                                                     mean.f32(), rstd.f32(), N, C, pg, pb);
  check_launch(op);
  add_partial_sums(pg, chunks, C, dgamma.raw(), dgamma.dtype(), stream_);
  add_partial_sums(pb, chunks, C, dbeta.raw(), dbeta.dtype(), stream_);
}

}  // namespace gpt
