// The Llama-style ops on the GPU: RMSNorm, SwiGLU and the rotary position embedding (backend.h), the
// CUDA twins of model/ops/cpu/cpu_llama.cpp. Kernels are compiled once per activation dtype (cuda_half.cuh's
// storage types, no per-element dtype switch) and compute in fp32; where a row's width and addresses allow,
// each thread moves whole 16-byte chunks (one 128-bit load or store: 8 bf16/fp16 values or 4 floats), else
// single elements, from one kernel body (the chunk width V is a template parameter). RMSNorm uses one warp
// per row:
//   y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps);
//   dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma, xhat = x * rstd;
// its gamma gradient is a column sum over rows, taken like layernorm's: fp32 partial sums per chunk of 64
// rows added chunk by chunk in order (reproducible, no atomics). SwiGLU and the rotation share their
// per-element math with the CPU (model/ops/llama_math.h); the rotation computes each (row, pair)'s angle
// once for all the row's q and k heads.
#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_half.cuh"
#include "model/ops/cuda/cuda_launch.h"
#include "model/ops/cuda/cuda_reduce.cuh"
#include "model/ops/llama_math.h"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kRowsPerBlock = kWarpRowsPerBlock;  // one warp per row (cuda_check.h)
constexpr int kThreads = 256;

// ---- RMSNorm ----

// Rows of x [N, C] -> y [N, C], rstd [N]. Block = 8 warps, one row each; lanes take chunks of V columns.
template <class T, class W, int V>
__global__ void rmsnorm_forward_kernel(const T* x, const W* gamma, T* y, float* rstd, int64_t N, int64_t C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;  // the whole warp leaves together
  const T* xr = x + row * C;
  T* yr = y + row * C;
  float sq = 0.f;
  for (int64_t c = int64_t(lane) * V; c < C; c += 32 * V) {
    float v[V];
    load_chunk<V>(xr + c, v);
#pragma unroll
    for (int i = 0; i < V; ++i) sq += v[i] * v[i];
  }
  const float rs = 1.f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
  for (int64_t c = int64_t(lane) * V; c < C; c += 32 * V) {
    float v[V], g[V];
    load_chunk<V>(xr + c, v);
    load_chunk<V>(gamma + c, g);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = v[i] * rs * g[i];
    store_chunk<V>(yr + c, v);
  }
  if (lane == 0) rstd[row] = rs;
}

// dx for each row; same block shape as the forward.
template <class T, class W, int V>
__global__ void rmsnorm_dx_kernel(const T* dy, const T* x, const W* gamma, const float* rstd, T* dx, int64_t N,
                                  int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int64_t base = row * C;
  const float rs = rstd[row];
  // Columns c..c+V-1 of dy, x and gamma (the two passes read them alike).
  const auto load = [&](int64_t c, float(&d)[V], float(&v)[V], float(&g)[V]) {
    load_chunk<V>(dy + base + c, d);
    load_chunk<V>(x + base + c, v);
    load_chunk<V>(gamma + c, g);
  };
  float sum_gx = 0.f;
  for (int64_t c = int64_t(lane) * V; c < C; c += 32 * V) {
    float d[V], v[V], g[V];
    load(c, d, v, g);
#pragma unroll
    for (int i = 0; i < V; ++i) sum_gx += d[i] * g[i] * v[i] * rs;
  }
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);
  for (int64_t c = int64_t(lane) * V; c < C; c += 32 * V) {
    float d[V], v[V], g[V];
    load(c, d, v, g);
#pragma unroll
    for (int i = 0; i < V; ++i) d[i] = rs * (d[i] * g[i] - v[i] * rs * mean_gx);
    store_chunk<V>(dx + base + c, d);
  }
}

// Per chunk k of 64 rows: pg[k, c] = sum of dy * x * rstd. Grid (ceil(C / 32), chunks), block (32, 8).
template <class T>
__global__ void rmsnorm_gamma_partials_kernel(const T* x, const T* dy, const float* rstd, int64_t N, int64_t C,
                                              float* pg) {
  __shared__ float acc[8][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * kColumnSumRowsPerChunk;
  const int64_t r1 = min(N, r0 + kColumnSumRowsPerChunk);
  float s = 0.f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += to_f32(dy[r * C + c]) * to_f32(x[r * C + c]) * rstd[r];
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.f;
    for (int y = 0; y < 8; ++y) t += acc[y][threadIdx.x];
    pg[int64_t(blockIdx.y) * C + c] = t;
  }
}

// ---- SwiGLU ----

// y[n, f] = silu(x[n, f]) * x[n, F + f] over N*F elements in chunks of V; x [N, 2F], y [N, F].
template <class T, int V>
__global__ void swiglu_forward_kernel(const T* x, T* y, int64_t N, int64_t F) {
  const int64_t chunks = N * F / V;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < chunks; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = e * V / F, f = e * V % F;
    float gate[V], up[V], out[V];
    load_chunk<V>(x + n * 2 * F + f, gate);
    load_chunk<V>(x + n * 2 * F + F + f, up);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = ops::swiglu_value(gate[i], up[i], 1.f / (1.f + expf(-gate[i])));
    store_chunk<V>(y + e * V, out);
  }
}

// dx [N, 2F] from dy [N, F] and x [N, 2F].
template <class T, int V>
__global__ void swiglu_backward_kernel(const T* dy, const T* x, T* dx, int64_t N, int64_t F) {
  const int64_t chunks = N * F / V;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < chunks; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = e * V / F, f = e * V % F;
    float d[V], gate[V], up[V], dgate[V], dup[V];
    load_chunk<V>(dy + e * V, d);
    load_chunk<V>(x + n * 2 * F + f, gate);
    load_chunk<V>(x + n * 2 * F + F + f, up);
#pragma unroll
    for (int i = 0; i < V; ++i) ops::swiglu_grad(d[i], gate[i], up[i], 1.f / (1.f + expf(-gate[i])), dgate[i], dup[i]);
    store_chunk<V>(dx + n * 2 * F + f, dgate);
    store_chunk<V>(dx + n * 2 * F + F + f, dup);
  }
}

// ---- rotary embedding ----

// In place on the first `heads` heads (q and k, D apart) of each row of qkv [rows, ld]: one thread per
// (row, chunk of V pairs i..i+V-1 of the R/2), rotating those pairs of every head by the row's angles
// (sin times `sign`: -1 rotates back, the backward pass).
template <class T, int V>
__global__ void rope_kernel(T* qkv, int64_t rows, int64_t T_, int64_t heads, int64_t D, int64_t ld, int64_t R,
                            float base, int64_t pos0, float sign) {
  const int64_t half = R / 2, per_row = half / V;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < rows * per_row;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = e / per_row, i = e % per_row * V;
    const int64_t pos = pos0 + n % T_;
    float c[V], s[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      ops::rope_cos_sin(pos, ops::rope_inv_freq(i + k, R, base), c[k], s[k]);
      s[k] *= sign;
    }
    for (int64_t h = 0; h < heads; ++h) {
      T* p = qkv + n * ld + h * D + i;
      float a[V], b[V];
      load_chunk<V>(p, a);
      load_chunk<V>(p + half, b);
#pragma unroll
      for (int k = 0; k < V; ++k) ops::rope_rotate(a[k], b[k], c[k], s[k]);
      store_chunk<V>(p, a);
      store_chunk<V>(p + half, b);
    }
  }
}

}  // namespace

void CudaBackend::rmsnorm_forward(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd, float eps) {
  const char* op = "rmsnorm_forward";
  const ops::RowDims dims = ops::check_rmsnorm(kChecks, x, gamma, y, rstd, op);
  const int64_t N = dims.rows, C = dims.cols;
  if (N == 0) return;
  const unsigned row_grid = warp_row_blocks(N, op);
  with_row_kernel(x, gamma, C, {x.raw(), y.raw()}, {gamma.raw()}, [&](auto t, auto w, auto v) {
    using T = decltype(t);
    using W = decltype(w);
    rmsnorm_forward_kernel<T, W, decltype(v)::value><<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
        static_cast<const T*>(x.raw()), static_cast<const W*>(gamma.raw()), static_cast<T*>(y.raw()), rstd.f32(), N, C,
        eps);
  });
  check_launch(op);
}

void CudaBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                   Tensor& dx, Tensor& dgamma) {
  const char* op = "rmsnorm_backward";
  const ops::RowDims dims = ops::check_rmsnorm_backward(kChecks, dy, x, gamma, rstd, dx, dgamma, op);
  const int64_t N = dims.rows, C = dims.cols;
  if (N == 0) return;
  const unsigned row_grid = warp_row_blocks(N, op);
  const int64_t chunks = column_sum_chunks(N, op);
  Tensor partials = empty({chunks, C});
  with_row_kernel(x, gamma, C, {dy.raw(), x.raw(), dx.raw()}, {gamma.raw()}, [&](auto t, auto w, auto v) {
    using T = decltype(t);
    using W = decltype(w);
    const T *dyp = static_cast<const T*>(dy.raw()), *xp = static_cast<const T*>(x.raw());
    rmsnorm_dx_kernel<T, W, decltype(v)::value><<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
        dyp, xp, static_cast<const W*>(gamma.raw()), rstd.f32(), static_cast<T*>(dx.raw()), N, C);
    check_launch(op);
    const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
    rmsnorm_gamma_partials_kernel<T><<<grid, dim3(32, 8), 0, stream_>>>(xp, dyp, rstd.f32(), N, C, partials.f32());
  });
  check_launch(op);
  add_partial_sums(partials.f32(), chunks, C, dgamma.raw(), dgamma.dtype(), stream_);
}

void CudaBackend::swiglu_forward(const Tensor& x, Tensor& y) {
  const char* op = "swiglu_forward";
  const ops::RowDims dims = ops::check_swiglu(kChecks, x, y, "y", op);
  const int64_t N = dims.rows, F = dims.cols;
  if (N == 0) return;
  with_float_type(x.dtype(), [&](auto t) {
    using T = decltype(t);
    with_chunk_width<T>({F}, {{x.raw(), sizeof(T)}, {y.raw(), sizeof(T)}}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      swiglu_forward_kernel<T, V><<<grid_for(N * F / V, kThreads), kThreads, 0, stream_>>>(
          static_cast<const T*>(x.raw()), static_cast<T*>(y.raw()), N, F);
    });
  });
  check_launch(op);
}

void CudaBackend::swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "swiglu_backward";
  const ops::RowDims dims = ops::check_swiglu_backward(kChecks, dy, x, dx, op);
  const int64_t N = dims.rows, F = dims.cols;
  if (N == 0) return;
  with_float_type(x.dtype(), [&](auto t) {
    using T = decltype(t);
    with_chunk_width<T>({F}, {{dy.raw(), sizeof(T)}, {x.raw(), sizeof(T)}, {dx.raw(), sizeof(T)}}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      swiglu_backward_kernel<T, V><<<grid_for(N * F / V, kThreads), kThreads, 0, stream_>>>(
          static_cast<const T*>(dy.raw()), static_cast<const T*>(x.raw()), static_cast<T*>(dx.raw()), N, F);
    });
  });
  check_launch(op);
}

namespace {

void rope(Tensor& qkv, const ops::RopeDims& d, float base, int64_t pos0, float sign, cudaStream_t stream,
          const char* op) {
  with_float_type(qkv.dtype(), [&](auto t) {
    using T = decltype(t);
    with_chunk_width<T>({d.R / 2, d.D}, {{qkv.raw(), sizeof(T)}}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      rope_kernel<T, V><<<grid_for(d.rows() * (d.R / 2 / V), kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(qkv.raw()), d.rows(), d.T, d.heads(), d.D, d.ld(), d.R, base, pos0, sign);
    });
  });
  check_launch(op);
}

}  // namespace

void CudaBackend::rope_forward(Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                               int64_t rotary_dims, float base, int64_t pos0) {
  const char* op = "rope_forward";
  rope(qkv, ops::check_rope(kChecks, qkv, B, T, H, G, D, rotary_dims, base, pos0, op, "qkv"), base, pos0, 1.f,
       stream_, op);
}

void CudaBackend::rope_backward(Tensor& dqkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                                int64_t rotary_dims, float base, int64_t pos0) {
  const char* op = "rope_backward";
  rope(dqkv, ops::check_rope(kChecks, dqkv, B, T, H, G, D, rotary_dims, base, pos0, op, "dqkv"), base, pos0, -1.f,
       stream_, op);
}

}  // namespace gpt
