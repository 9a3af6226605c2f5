// Causal multi-head self-attention on the GPU: batched cuBLAS products over the B*H (sequence, head)
// pairs plus fused masked-softmax kernels, keeping the softmax in probs [B, H, T, T] (fp32) for the
// backward pass as the interface requires. The packed qkv rows [B, T, 3, H, D] are first split into
// per-head matrices [3, B, H, T, D] so each product is one strided-batched call, and the result is merged
// back into rows [B, T, H, D].
//   forward:  S = Q K^T / sqrt(D) (fp32), P = causal_softmax(S), O = P V;
//   backward: dV = P^T dO, dP = dO V^T (fp32), dS = P * (dP - rowsum(P * dP)) / sqrt(D),
//             dQ = dS K, dK = dS^T Q.
// With 16-bit activations the products run on the tensor cores: P and dS are rounded to the activation
// dtype for the products that consume them (as fused attention kernels do), while S, P (the saved copy)
// and dP stay fp32. The full T x T products include the masked upper triangle, whose P and dS are zero.
#include <cmath>

#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_half.cuh"
#include "model/ops/cuda/cuda_launch.h"
#include "model/ops/cuda/cuda_reduce.cuh"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kRowsPerBlock = 8;  // softmax kernels: one warp per score row

// Moves between the row layout [B, T, P, H, D] and the head layout [P, B, H, T, D] (P = 3 for q|k|v,
// 1 for the output), converting dtypes on the way. One thread per element of the head layout.
__global__ void permute_heads_kernel(const void* src, DType sd, void* dst, DType dd, int64_t P, int64_t B, int64_t T,
                                     int64_t H, int64_t D, bool to_heads) {
  const int64_t n = P * B * H * T * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i;
    const int64_t d = r % D;
    r /= D;
    const int64_t t = r % T;
    r /= T;
    const int64_t h = r % H;
    r /= H;
    const int64_t b = r % B;
    const int64_t p = r / B;
    const int64_t row_index = (((b * T + t) * P + p) * H + h) * D + d;
    if (to_heads)
      store_from_f32(dst, dd, i, load_as_f32(src, sd, row_index));
    else
      store_from_f32(dst, dd, row_index, load_as_f32(src, sd, i));
  }
}

// In place on s [rows = B*H*T, T] holding scaled scores: row q (q = row % T) becomes
// softmax(s[0..q]) followed by zeros. Also writes the result rounded to `pd` into p when p is non-null.
__global__ void causal_softmax_kernel(float* s, void* p, DType pd, int64_t rows, int64_t T) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warp
  const int64_t q = row % T;
  float* r = s + row * T;
  const float neg_inf = -__int_as_float(0x7f800000);
  // Online max and sum of exponentials over this lane's share of columns 0..q.
  float m = neg_inf, sum = 0.f;
  for (int64_t j = lane; j <= q; j += 32) {
    const float v = r[j];
    if (v > m) {
      sum = sum * expf(m - v) + 1.f;
      m = v;
    } else {
      sum += expf(v - m);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float s2 = __shfl_xor_sync(0xffffffffu, sum, offset);
    const float mx = fmaxf(m, m2);
    sum = (m == neg_inf ? 0.f : sum * expf(m - mx)) + (m2 == neg_inf ? 0.f : s2 * expf(m2 - mx));
    m = mx;
  }
  const float inv = 1.f / sum;
  for (int64_t j = lane; j < T; j += 32) {
    const float v = j <= q ? expf(r[j] - m) * inv : 0.f;
    r[j] = v;
    if (p) store_from_f32(p, pd, row * T + j, v);
  }
}

// ds[row, j] = scale * p * (dp - sum_j' p dp) for j <= q, 0 above (q = row % T); p and dp fp32
// [rows, T], ds of dtype dsd (may alias dp when fp32: each element is read before it is written, by the
// same thread).
__global__ void softmax_backward_kernel(const float* p, const float* dp, void* ds, DType dsd, int64_t rows, int64_t T,
                                        float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t q = row % T;
  const float* pr = p + row * T;
  const float* dr = dp + row * T;
  float dot = 0.f;
  for (int64_t j = lane; j <= q; j += 32) dot += pr[j] * dr[j];
  dot = warp_sum(dot);
  for (int64_t j = lane; j < T; j += 32) {
    const float v = j <= q ? scale * pr[j] * (dr[j] - dot) : 0.f;
    store_from_f32(ds, dsd, row * T + j, v);
  }
}

void permute(const void* src, DType sd, void* dst, DType dd, int64_t P, const ops::AttentionDims& s, bool to_heads,
             cudaStream_t stream, const char* op) {
  const int64_t n = P * s.head_elems();
  permute_heads_kernel<<<grid_for(n, 256), 256, 0, stream>>>(src, sd, dst, dd, P, s.B, s.T, s.H, s.D, to_heads);
  check_launch(op);
}

unsigned softmax_blocks(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

void CudaBackend::attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t D, Tensor& out,
                                    Tensor& probs) {
  const char* op = "attention_forward";
  const ops::AttentionDims s = ops::check_attention(kChecks, qkv, probs, B, T, H, D, op);
  require_float(out, op, "out");
  require_numel(out, B * T * H * D, op, "out", "[B*T, H*D]");
  const DType X = qkv.dtype();
  const size_t es = dtype_size(X);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));

  Tensor heads = empty({3, s.bh(), T, D}, X);
  permute(qkv.raw(), X, heads.raw(), X, 3, s, true, stream_, op);
  const char* q = static_cast<const char*>(heads.raw());
  const char* k = q + s.head_elems() * es;
  const char* v = k + s.head_elems() * es;

  GemmArgs g;  // S = scale * Q K^T, fp32 into probs
  g.m = T, g.n = T, g.k = D;
  g.a = q, g.lda = D, g.stride_a = T * D;
  g.b = k, g.ldb = D, g.stride_b = T * D, g.trans_b = true;
  g.c = probs.raw(), g.ldc = T, g.stride_c = T * T, g.c_dtype = DType::F32;
  g.ab = X, g.alpha = scale, g.batch = s.bh();
  gemm(g, op);

  Tensor p16;  // P rounded to the activation dtype for the P V product
  if (X != DType::F32) p16 = empty({s.bh(), T, T}, X);
  const int64_t rows = s.bh() * T;
  causal_softmax_kernel<<<softmax_blocks(rows), 32 * kRowsPerBlock, 0, stream_>>>(
      probs.f32(), p16.defined() ? p16.raw() : nullptr, X, rows, T);
  check_launch(op);

  Tensor o = empty({s.bh(), T, D}, X);
  GemmArgs pv;  // O = P V
  pv.m = T, pv.n = D, pv.k = T;
  pv.a = p16.defined() ? p16.raw() : probs.raw(), pv.lda = T, pv.stride_a = T * T;
  pv.b = v, pv.ldb = D, pv.stride_b = T * D;
  pv.c = o.raw(), pv.ldc = D, pv.stride_c = T * D, pv.c_dtype = X;
  pv.ab = X, pv.batch = s.bh();
  gemm(pv, op);
  permute(o.raw(), X, out.raw(), out.dtype(), 1, s, false, stream_, op);
}

void CudaBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t B, int64_t T,
                                     int64_t H, int64_t D, Tensor& dqkv) {
  const char* op = "attention_backward";
  const ops::AttentionDims s = ops::check_attention(kChecks, qkv, probs, B, T, H, D, op);
  require_float(dout, op, "dout");
  require_numel(dout, B * T * H * D, op, "dout", "[B*T, H*D]");
  require_float(dqkv, op, "dqkv");
  require_numel(dqkv, qkv.numel(), op, "dqkv", "qkv's shape " + shape_str(qkv.shape()));
  const DType X = qkv.dtype();
  const size_t es = dtype_size(X);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const int64_t bh = s.bh(), TT = T * T, TD = T * D;

  Tensor heads = empty({3, bh, T, D}, X);
  permute(qkv.raw(), X, heads.raw(), X, 3, s, true, stream_, op);
  const char* q = static_cast<const char*>(heads.raw());
  const char* k = q + s.head_elems() * es;
  const char* v = k + s.head_elems() * es;
  Tensor dO = empty({bh, T, D}, X);
  permute(dout.raw(), dout.dtype(), dO.raw(), X, 1, s, true, stream_, op);
  // P in the activation dtype; for 16-bit activations this buffer later receives dS.
  Tensor p16 = X == DType::F32 ? probs : as_dtype(probs, X);

  Tensor dheads = empty({3, bh, T, D}, X);
  char* dq = static_cast<char*>(dheads.raw());
  char* dk = dq + s.head_elems() * es;
  char* dv = dk + s.head_elems() * es;

  GemmArgs g;  // dV = P^T dO
  g.m = T, g.n = D, g.k = T;
  g.a = p16.raw(), g.lda = T, g.stride_a = TT, g.trans_a = true;
  g.b = dO.raw(), g.ldb = D, g.stride_b = TD;
  g.c = dv, g.ldc = D, g.stride_c = TD, g.c_dtype = X;
  g.ab = X, g.batch = bh;
  gemm(g, op);

  Tensor dP = empty({bh, T, T}, DType::F32);
  g = GemmArgs();  // dP = dO V^T, fp32
  g.m = T, g.n = T, g.k = D;
  g.a = dO.raw(), g.lda = D, g.stride_a = TD;
  g.b = v, g.ldb = D, g.stride_b = TD, g.trans_b = true;
  g.c = dP.raw(), g.ldc = T, g.stride_c = TT, g.c_dtype = DType::F32;
  g.ab = X, g.batch = bh;
  gemm(g, op);

  Tensor dS = X == DType::F32 ? dP : p16;
  const int64_t rows = bh * T;
  softmax_backward_kernel<<<softmax_blocks(rows), 32 * kRowsPerBlock, 0, stream_>>>(probs.f32(), dP.f32(), dS.raw(), X,
                                                                                    rows, T, scale);
  check_launch(op);

  g = GemmArgs();  // dQ = dS K
  g.m = T, g.n = D, g.k = T;
  g.a = dS.raw(), g.lda = T, g.stride_a = TT;
  g.b = k, g.ldb = D, g.stride_b = TD;
  g.c = dq, g.ldc = D, g.stride_c = TD, g.c_dtype = X;
  g.ab = X, g.batch = bh;
  gemm(g, op);

  g.a = dS.raw(), g.trans_a = true;  // dK = dS^T Q
  g.b = q;
  g.c = dk;
  gemm(g, op);

  permute(dheads.raw(), X, dqkv.raw(), dqkv.dtype(), 3, s, false, stream_, op);
}

}  // namespace gpt
