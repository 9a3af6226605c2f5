// Causal self-attention on the GPU (multi-head, or grouped-query: H query heads sharing G key/value heads),
// unfused: strided-batched cuBLAS products over the heads of one sequence at a time plus warp-per-row
// softmax kernels, on the fused contract (backend.h): Q, K and V are read in place from the packed qkv rows
// by strides (leading dimension (H + 2G)*D, heads D apart), the
// output is written in place into its rows, and forward keeps only the per-row log-sum-exp; backward
// recomputes the probabilities from it. The [H, T, T] score buffers are per-call scratch from the caching
// allocator, one sequence at a time, and never outlive the call.
//   forward:  S = Q K^T / sqrt(D) (fp32), P = causal_softmax(S), lse = log rowsum exp(S), O = P V;
//   backward: P = exp(S - lse), Dv = rowsum(dO * O), dV = P^T dO, dP = dO V^T (fp32),
//             dS = P * (dP - Dv) / sqrt(D), dQ = dS K, dK = dS^T Q.
// With 16-bit activations the products run on the tensor cores: P and dS are rounded to the activation
// dtype for the products that consume them, while S, dP and the statistics stay fp32. The full T x T
// products include the masked upper triangle, whose P and dS are zero.
// Grouped-query attention (r = H/G query heads per group): each product is issued r times, the j-th a batch
// over the G groups of query head g*r + j against group g's K or V (for r = 1 the single batch over all
// heads). dK and dV sum over a group's r heads: they accumulate in fp32 scratch [2G, T, D] and are then
// written into dqkv's rows.
#include <cmath>

#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_half.cuh"
#include "model/ops/cuda/cuda_launch.h"
#include "model/ops/cuda/cuda_reduce.cuh"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kRowsPerBlock = kWarpRowsPerBlock;  // one warp per row (cuda_check.h)

// In place on s [rows = H*Tq, T] holding one sequence's scaled scores for its last Tq positions: row r
// (query position q = q0 + r % Tq) becomes softmax(s[0..q]) followed by zeros; lse[r] gets the row's
// log-sum-exp. Also writes the probabilities rounded to `pd` into p when p is non-null.
__global__ void causal_softmax_kernel(float* s, void* p, DType pd, float* lse, int64_t rows, int64_t Tq, int64_t T,
                                      int64_t q0) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warp
  const int64_t q = q0 + row % Tq;
  float* r = s + row * T;
  const float neg_inf = -__int_as_float(0x7f800000);
  // Online max and sum of exponentials over this lane's share of columns 0..q.
  float m = neg_inf, sum = 0.f;
  const int64_t last = q < T - 1 ? q : T - 1;  // a query past the block's keys sees all of them
  for (int64_t j = lane; j <= last; j += 32) {
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
  if (lane == 0) lse[row] = m + logf(sum);
  for (int64_t j = lane; j < T; j += 32) {
    const float v = j <= q ? expf(r[j] - m) * inv : 0.f;
    r[j] = v;
    if (p) store_from_f32(p, pd, row * T + j, v);
  }
}

// In place on s [rows = H*Tq, T] holding scaled scores: P = exp(S - lse[r]) on the columns row r's query
// (position q0 + r % Tq) sees, zero past them; also rounded to `pd` into p when p is non-null.
__global__ void probabilities_kernel(float* s, void* p, DType pd, const float* lse, int64_t rows, int64_t Tq,
                                     int64_t T, int64_t q0) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t q = q0 + row % Tq;
  const float l = lse[row];
  float* r = s + row * T;
  for (int64_t j = lane; j < T; j += 32) {
    const float v = j <= q ? expf(r[j] - l) : 0.f;
    r[j] = v;
    if (p) store_from_f32(p, pd, row * T + j, v);
  }
}

// ds[row, j] = scale * p * (dp - dv[row]) ([rows, T], p and dp fp32); ds of dtype dsd may alias dp when
// fp32 (each element is read before it is written, by the same thread).
__global__ void softmax_backward_kernel(const float* p, const float* dp, void* ds, DType dsd, const float* dv,
                                        int64_t rows, int64_t T, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float* pr = p + row * T;
  const float* dr = dp + row * T;
  const float d = dv[row];
  for (int64_t j = lane; j < T; j += 32) store_from_f32(ds, dsd, row * T + j, scale * pr[j] * (dr[j] - d));
}

// dv[(b*H + h)*T + t] = sum_d out[b, t, h, d] * dout[b, t, h, d] (rows of H*D elements, heads D apart).
__global__ void row_dot_kernel(const void* out, DType od, const void* dout, DType dd, float* dv, int64_t B,
                               int64_t T, int64_t H, int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);  // (b, h, t)
  if (row >= B * H * T) return;
  const int64_t t = row % T, bh = row / T, h = bh % H, b = bh / H;
  const int64_t first = ((b * T + t) * H + h) * D;
  float sum = 0.f;
  for (int64_t d = lane; d < D; d += 32) sum += load_as_f32(out, od, first + d) * load_as_f32(dout, dd, first + d);
  sum = warp_sum(sum);
  if (lane == 0) dv[row] = sum;
}

// The products write out and dqkv in place with strided batches, which cuBLAS can do in the activation
// dtype or in fp32 only.
void require_product_output(const Tensor& t, DType X, const char* op, const char* arg) {
  kChecks.require(t.dtype() == X || t.dtype() == DType::F32, op,
                  std::string(arg) + " " + ops::describe(t) + " must have qkv's dtype (" + dtype_name(X) + ") or F32");
}

// dqkv[b*T + t, k_offset + c] = acc[c / D, t, c % D] for c < 2*G*D: one sequence's summed dK and dV (the k and
// v parts of a row are contiguous, group after group), rounded to the tensor's dtype.
template <class X>
__global__ void store_group_grads_kernel(const float* acc, X* dqkv, int64_t T, int64_t GD2, int64_t D, int64_t ld) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < T * GD2; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / GD2, c = e % GD2;
    dqkv[t * ld + c] = from_f32<X>(acc[(c / D * T + t) * D + c % D]);
  }
}

// Byte address of element `e` of a tensor's storage.
const char* at(const Tensor& t, int64_t e) { return static_cast<const char*>(t.raw()) + e * dtype_size(t.dtype()); }
char* at(Tensor& t, int64_t e) { return static_cast<char*>(t.raw()) + e * dtype_size(t.dtype()); }

}  // namespace

void CudaBackend::attention_forward_last(const Tensor& qkv, int64_t B, int64_t T, int64_t Tq, int64_t H, int64_t G,
                                         int64_t D, Tensor& out, Tensor& lse) {
  const char* op = "attention_forward";
  const ops::AttentionDims s = ops::check_attention_last(kChecks, qkv, out, lse, B, T, Tq, H, G, D, op);
  if (Tq == T && cudnn_attention_forward(s, qkv, out, lse)) return;  // cuDNN's graph: whole sequences only
  const DType X = qkv.dtype();
  require_product_output(out, X, op, "out");
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const int64_t ld = s.qkv_ld(), ldo = s.out_ld(), rows = H * Tq, q0 = s.q0(), r = s.group_size();
  const unsigned row_grid = warp_row_blocks(rows, op);
  // One sequence's heads as strided batches over the groups: query head g*r + j's matrix starts
  // (g*r + j) * D elements after the sequence's first row, group g's K and V g * D after theirs, with the
  // packed tensor's leading dimension.
  const auto heads = [&] {
    GemmArgs g;
    g.batch = G;
    return g;
  };

  Tensor scores = empty({H, Tq, T});  // one sequence at a time
  Tensor p16;                         // P rounded to the activation dtype for the P V product
  if (X != DType::F32) p16 = empty({H, Tq, T}, X);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q = b * T * ld, k = q + s.k_offset(), v = q + s.v_offset();
    for (int64_t j = 0; j < r; ++j) {
      GemmArgs g = heads();  // S = scale * Q K^T, fp32, for the query rows q0..T-1
      g.m = Tq, g.n = T, g.k = D;
      g.a = at(qkv, q + q0 * ld + j * D), g.lda = ld, g.stride_a = r * D;
      g.b = at(qkv, k), g.ldb = ld, g.stride_b = D, g.trans_b = true;
      g.c = at(scores, j * Tq * T), g.ldc = T, g.stride_c = r * Tq * T;
      g.c_dtype = DType::F32, g.ab = X, g.alpha = scale;
      gemm(g, op);
    }

    causal_softmax_kernel<<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
        scores.f32(), p16.defined() ? p16.raw() : nullptr, X, lse.f32() + b * rows, rows, Tq, T, q0);
    check_launch(op);

    const Tensor& P = p16.defined() ? p16 : scores;
    for (int64_t j = 0; j < r; ++j) {
      GemmArgs pv = heads();  // O = P V, into out's rows
      pv.m = Tq, pv.n = D, pv.k = T;
      pv.a = at(P, j * Tq * T), pv.lda = T, pv.stride_a = r * Tq * T;
      pv.b = at(qkv, v), pv.ldb = ld, pv.stride_b = D;
      pv.c = at(out, b * Tq * ldo + j * D), pv.ldc = ldo, pv.stride_c = r * D, pv.c_dtype = out.dtype();
      pv.ab = X;
      gemm(pv, op);
    }
  }
}

void CudaBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, Tensor& dqkv) {
  const char* op = "attention_backward";
  const ops::AttentionDims s = ops::check_attention(kChecks, qkv, out, lse, B, T, H, G, D, op);
  require_float(dout, op, "dout");
  require_numel(dout, B * T * H * D, op, "dout", "[B*T, H*D]");
  require_float(dqkv, op, "dqkv");
  require_numel(dqkv, qkv.numel(), op, "dqkv", "qkv's shape " + shape_str(qkv.shape()));
  if (cudnn_attention_backward(s, dout, qkv, out, lse, dqkv)) return;
  const DType X = qkv.dtype();
  require_product_output(dqkv, X, op, "dqkv");
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const int64_t ld = s.qkv_ld(), ldo = s.out_ld(), rows = H * T, TT = T * T, r = s.group_size();
  const unsigned row_grid = warp_row_blocks(rows, op), all_rows_grid = warp_row_blocks(B * rows, op);
  const auto heads = [&] {  // as in forward
    GemmArgs g;
    g.batch = G;
    return g;
  };

  Tensor dv_rows = empty({B, H, T});  // Dv = rowsum(dO * O)
  row_dot_kernel<<<all_rows_grid, 32 * kRowsPerBlock, 0, stream_>>>(out.raw(), out.dtype(), dout.raw(),
                                                                    dout.dtype(), dv_rows.f32(), B, T, H, D);
  check_launch(op);
  const Tensor dO = as_dtype(dout, X);  // the products read dO in the activation dtype
  Tensor p = empty({H, T, T}), dP = empty({H, T, T});
  Tensor p16 = X == DType::F32 ? p : empty({H, T, T}, X);  // P, then dS, in the activation dtype
  // With groups (r > 1), one sequence's dK (groups 0..G-1) then dV, summed over each group's heads in fp32.
  Tensor acc = r > 1 ? empty({2 * G, T, D}) : Tensor();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q = b * T * ld, k = q + s.k_offset(), v = q + s.v_offset(), o = b * T * ldo;
    for (int64_t j = 0; j < r; ++j) {
      GemmArgs g = heads();  // S = scale * Q K^T, fp32, then P
      g.m = T, g.n = T, g.k = D;
      g.a = at(qkv, q + j * D), g.lda = ld, g.stride_a = r * D;
      g.b = at(qkv, k), g.ldb = ld, g.stride_b = D, g.trans_b = true;
      g.c = at(p, j * TT), g.ldc = T, g.stride_c = r * TT, g.c_dtype = DType::F32;
      g.ab = X, g.alpha = scale;
      gemm(g, op);
    }
    probabilities_kernel<<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
        p.f32(), X == DType::F32 ? nullptr : p16.raw(), X, lse.f32() + b * rows, rows, T, T, 0);
    check_launch(op);

    // Where dK and dV go: straight into dqkv's rows (one head per group), or summed into acc.
    const auto kv_grad = [&](GemmArgs& g, int64_t j, int64_t first, int64_t part) {
      if (r == 1) {
        g.c = at(dqkv, first), g.ldc = ld, g.stride_c = D, g.c_dtype = dqkv.dtype();
      } else {
        g.c = at(acc, part * G * T * D), g.ldc = D, g.stride_c = T * D, g.c_dtype = DType::F32;
        g.beta = j == 0 ? 0.f : 1.f;
      }
    };
    for (int64_t j = 0; j < r; ++j) {
      GemmArgs g = heads();  // dV = P^T dO
      g.m = T, g.n = D, g.k = T;
      g.a = at(p16, j * TT), g.lda = T, g.stride_a = r * TT, g.trans_a = true;
      g.b = at(dO, o + j * D), g.ldb = ldo, g.stride_b = r * D;
      kv_grad(g, j, v, 1);
      g.ab = X;
      gemm(g, op);

      g = heads();  // dP = dO V^T, fp32
      g.m = T, g.n = T, g.k = D;
      g.a = at(dO, o + j * D), g.lda = ldo, g.stride_a = r * D;
      g.b = at(qkv, v), g.ldb = ld, g.stride_b = D, g.trans_b = true;
      g.c = at(dP, j * TT), g.ldc = T, g.stride_c = r * TT, g.c_dtype = DType::F32;
      g.ab = X;
      gemm(g, op);
    }

    Tensor dS = X == DType::F32 ? dP : p16;
    softmax_backward_kernel<<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
        p.f32(), dP.f32(), dS.raw(), X, dv_rows.f32() + b * rows, rows, T, scale);
    check_launch(op);

    for (int64_t j = 0; j < r; ++j) {
      GemmArgs g = heads();  // dQ = dS K
      g.m = T, g.n = D, g.k = T;
      g.a = at(dS, j * TT), g.lda = T, g.stride_a = r * TT;
      g.b = at(qkv, k), g.ldb = ld, g.stride_b = D;
      g.c = at(dqkv, q + j * D), g.ldc = ld, g.stride_c = r * D, g.c_dtype = dqkv.dtype();
      g.ab = X;
      gemm(g, op);

      g.trans_a = true;  // dK = dS^T Q
      g.b = at(qkv, q + j * D), g.stride_b = r * D;
      kv_grad(g, j, k, 0);
      gemm(g, op);
    }
    if (r > 1) {
      with_float_type(dqkv.dtype(), [&](auto tag) {
        using Y = decltype(tag);
        store_group_grads_kernel<Y><<<grid_for(T * 2 * G * D, 256), 256, 0, stream_>>>(
            acc.f32(), reinterpret_cast<Y*>(at(dqkv, k)), T, 2 * G * D, D, ld);
      });
      check_launch(op);
    }
  }
}


// ---- attention between two blocks of positions (context parallelism's ring) ----
// 16-bit blocks of equal length go to cuDNN's fused attention first (cudnn_attention.h: the same graphs
// with the block's strides, and no mask for a full block), under model.attention_backend as the whole-
// sequence ops; otherwise the same unfused products on a query block q [B*Tq, ldq] against a key/value block kv [B*Tk, ldk] (keys
// at column ldk - 2G*D, values G*D after them), one sequence at a time. A causal block masks key j > query
// i; a full one masks nothing (the softmax kernels' q0 = Tk: every query sees every key). Backward adds into
// the fp32 accumulators with beta = 1, so dK and dV sum over a group's heads and over blocks with no scratch.

namespace {

// out (F32 [B*T, H*D]) and lse (F32 [B, H, T]) merged with a block's out_b and lse_b, one warp per (b, h, t).
__global__ void attention_merge_kernel(float* out, float* lse, const float* out_b, const float* lse_b, int64_t B,
                                       int64_t T, int64_t H, int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);  // (b, h, t)
  if (row >= B * H * T) return;
  const int64_t t = row % T, bh = row / T, h = bh % H, b = bh / H;
  const float la = lse[row], lb = lse_b[row];
  const float m = fmaxf(la, lb);
  if (m == -__int_as_float(0x7f800000)) return;  // neither block has a key for this query yet
  const float merged = m + logf(expf(la - m) + expf(lb - m));
  const float wa = expf(la - merged), wb = expf(lb - merged);
  const int64_t first = ((b * T + t) * H + h) * D;
  const bool empty = la == -__int_as_float(0x7f800000);  // nothing merged yet: take the block's
  for (int64_t d = lane; d < D; d += 32)
    out[first + d] = empty ? out_b[first + d] : wa * out[first + d] + wb * out_b[first + d];
  __syncwarp();
  if (lane == 0) lse[row] = merged;
}

// dst[:, dst_col..) = src[:, src_col..) (or += with `add`) over `rows` rows of `width` columns, converting.
__global__ void copy_columns_kernel(const void* src, DType sd, int64_t src_ld, int64_t src_col, void* dst, DType dd,
                                    int64_t dst_ld, int64_t dst_col, int64_t rows, int64_t width, bool add) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < rows * width;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / width, c = e % width, to = r * dst_ld + dst_col + c;
    const float v = load_as_f32(src, sd, r * src_ld + src_col + c);
    store_from_f32(dst, dd, to, add ? load_as_f32(dst, dd, to) + v : v);
  }
}

// dst (F32, [rows, width] dense) += src ([rows, width] dense, any float dtype): a cuDNN block's 16-bit
// gradient into the ring's fp32 accumulators.
void add_into_f32(const Tensor& src, Tensor& dst, cudaStream_t stream, const char* op) {
  const int64_t rows = src.dim(0), width = src.dim(1);
  copy_columns_kernel<<<grid_for(rows * width, 256), 256, 0, stream>>>(src.raw(), src.dtype(), width, 0, dst.raw(),
                                                                      DType::F32, width, 0, rows, width, true);
  check_launch(op);
}

// q and kv feed the same tensor-core products, so they share a dtype.
void require_same_dtype(const Tensor& q, const Tensor& kv, const char* op) {
  kChecks.require(q.dtype() == kv.dtype(), op,
                  "q " + ops::describe(q) + " and kv " + ops::describe(kv) + " must share a dtype");
}

}  // namespace

void CudaBackend::attention_block_forward(const Tensor& q, const Tensor& kv, int64_t B, int64_t Tq, int64_t Tk,
                                          int64_t H, int64_t G, int64_t D, bool causal, Tensor& out, Tensor& lse) {
  const char* op = "attention_block_forward";
  ops::check_attention_block(kChecks, q, kv, out, lse, B, Tq, Tk, H, G, D, causal, op);
  require_same_dtype(q, kv, op);
  const DType X = q.dtype();
  require_product_output(out, X, op, "out");
  if (Tq == Tk && X != DType::F32) {  // cuDNN's fused attention, into the activation dtype
    Tensor o16 = out.dtype() == X ? out.view({B * Tq, H * D}) : empty({B * Tq, H * D}, X);
    if (cudnn_block_forward(q, kv, B, Tq, H, G, D, causal, o16, lse)) {
      if (out.dtype() != X) {
        Tensor o = out.view({B * Tq, H * D});
        copy_columns(o16, 0, o, 0, H * D);
      }
      return;
    }
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const int64_t ldq = q.dim(1), ldk = kv.dim(1), koff = ldk - 2 * G * D, ldo = H * D, rows = H * Tq;
  const int64_t r = H / G, TT = Tq * Tk;
  Tensor scores = empty({H, Tq, Tk});
  Tensor p16;
  if (X != DType::F32) p16 = empty({H, Tq, Tk}, X);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qb = b * Tq * ldq, kb = b * Tk * ldk + koff, vb = kb + G * D;
    for (int64_t j = 0; j < r; ++j) {
      GemmArgs g;  // S = scale * Q K^T, fp32
      g.batch = G, g.m = Tq, g.n = Tk, g.k = D;
      g.a = at(q, qb + j * D), g.lda = ldq, g.stride_a = r * D;
      g.b = at(kv, kb), g.ldb = ldk, g.stride_b = D, g.trans_b = true;
      g.c = at(scores, j * TT), g.ldc = Tk, g.stride_c = r * TT;
      g.c_dtype = DType::F32, g.ab = X, g.alpha = scale;
      gemm(g, op);
    }
    causal_softmax_kernel<<<warp_row_blocks(rows, op), 32 * kRowsPerBlock, 0, stream_>>>(
        scores.f32(), p16.defined() ? p16.raw() : nullptr, X, lse.f32() + b * rows, rows, Tq, Tk, causal ? 0 : Tk);
    check_launch(op);
    const Tensor& P = p16.defined() ? p16 : scores;
    for (int64_t j = 0; j < r; ++j) {
      GemmArgs pv;  // O = P V
      pv.batch = G, pv.m = Tq, pv.n = D, pv.k = Tk;
      pv.a = at(P, j * TT), pv.lda = Tk, pv.stride_a = r * TT;
      pv.b = at(kv, vb), pv.ldb = ldk, pv.stride_b = D;
      pv.c = at(out, b * Tq * ldo + j * D), pv.ldc = ldo, pv.stride_c = r * D, pv.c_dtype = out.dtype();
      pv.ab = X;
      gemm(pv, op);
    }
  }
}

void CudaBackend::attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                           const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t G,
                                           int64_t D, bool causal, Tensor& dq, Tensor& dkv) {
  const char* op = "attention_block_backward";
  ops::check_attention_block_backward(kChecks, dout, q, kv, out, lse, B, Tq, Tk, H, G, D, causal, dq, dkv, op);
  require_same_dtype(q, kv, op);
  const DType X = q.dtype();
  if (Tq == Tk && X != DType::F32 && out.dtype() == X && dout.dtype() == X) {
    // cuDNN's fused backward writes this block's gradients in the activation dtype; they are added into
    // the fp32 accumulators (each block's share rounded once, as Transformer Engine's ring does).
    Tensor dq16 = empty({B * Tq, H * D}, X), dkv16 = empty({B * Tk, 2 * G * D}, X);
    if (cudnn_block_backward(dout, q, kv, out, lse, B, Tq, H, G, D, causal, dq16, dkv16)) {
      add_into_f32(dq16, dq, stream_, op);
      add_into_f32(dkv16, dkv, stream_, op);
      return;
    }
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const int64_t ldq = q.dim(1), ldk = kv.dim(1), koff = ldk - 2 * G * D, ldo = H * D, lda = 2 * G * D;
  const int64_t rows = H * Tq, r = H / G, TT = Tq * Tk;
  const unsigned row_grid = warp_row_blocks(rows, op);
  Tensor dv_rows = empty({B, H, Tq});  // Dv = rowsum(dO * O)
  row_dot_kernel<<<warp_row_blocks(B * rows, op), 32 * kRowsPerBlock, 0, stream_>>>(
      out.raw(), out.dtype(), dout.raw(), dout.dtype(), dv_rows.f32(), B, Tq, H, D);
  check_launch(op);
  const Tensor dO = as_dtype(dout, X);
  Tensor p = empty({H, Tq, Tk}), dP = empty({H, Tq, Tk});
  Tensor p16 = X == DType::F32 ? p : empty({H, Tq, Tk}, X);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qb = b * Tq * ldq, kb = b * Tk * ldk + koff, vb = kb + G * D, o = b * Tq * ldo;
    float* dqb = dq.f32() + b * Tq * ldo;
    float* dkb = dkv.f32() + b * Tk * lda;
    for (int64_t j = 0; j < r; ++j) {
      GemmArgs g;  // S = scale * Q K^T, fp32, then P
      g.batch = G, g.m = Tq, g.n = Tk, g.k = D;
      g.a = at(q, qb + j * D), g.lda = ldq, g.stride_a = r * D;
      g.b = at(kv, kb), g.ldb = ldk, g.stride_b = D, g.trans_b = true;
      g.c = at(p, j * TT), g.ldc = Tk, g.stride_c = r * TT, g.c_dtype = DType::F32;
      g.ab = X, g.alpha = scale;
      gemm(g, op);
    }
    probabilities_kernel<<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(
        p.f32(), X == DType::F32 ? nullptr : p16.raw(), X, lse.f32() + b * rows, rows, Tq, Tk, causal ? 0 : Tk);
    check_launch(op);
    for (int64_t j = 0; j < r; ++j) {
      GemmArgs g;  // dV += P^T dO
      g.batch = G, g.m = Tk, g.n = D, g.k = Tq;
      g.a = at(p16, j * TT), g.lda = Tk, g.stride_a = r * TT, g.trans_a = true;
      g.b = at(dO, o + j * D), g.ldb = ldo, g.stride_b = r * D;
      g.c = dkb + G * D, g.ldc = lda, g.stride_c = D, g.c_dtype = DType::F32, g.beta = 1.f;
      g.ab = X;
      gemm(g, op);

      g = GemmArgs();  // dP = dO V^T, fp32
      g.batch = G, g.m = Tq, g.n = Tk, g.k = D;
      g.a = at(dO, o + j * D), g.lda = ldo, g.stride_a = r * D;
      g.b = at(kv, vb), g.ldb = ldk, g.stride_b = D, g.trans_b = true;
      g.c = at(dP, j * TT), g.ldc = Tk, g.stride_c = r * TT, g.c_dtype = DType::F32;
      g.ab = X;
      gemm(g, op);
    }
    Tensor dS = X == DType::F32 ? dP : p16;
    softmax_backward_kernel<<<row_grid, 32 * kRowsPerBlock, 0, stream_>>>(p.f32(), dP.f32(), dS.raw(), X,
                                                                         dv_rows.f32() + b * rows, rows, Tk, scale);
    check_launch(op);
    for (int64_t j = 0; j < r; ++j) {
      GemmArgs g;  // dQ += dS K
      g.batch = G, g.m = Tq, g.n = D, g.k = Tk;
      g.a = at(dS, j * TT), g.lda = Tk, g.stride_a = r * TT;
      g.b = at(kv, kb), g.ldb = ldk, g.stride_b = D;
      g.c = dqb + j * D, g.ldc = ldo, g.stride_c = r * D, g.c_dtype = DType::F32, g.beta = 1.f;
      g.ab = X;
      gemm(g, op);

      g = GemmArgs();  // dK += dS^T Q
      g.batch = G, g.m = Tk, g.n = D, g.k = Tq;
      g.a = at(dS, j * TT), g.lda = Tk, g.stride_a = r * TT, g.trans_a = true;
      g.b = at(q, qb + j * D), g.ldb = ldq, g.stride_b = r * D;
      g.c = dkb, g.ldc = lda, g.stride_c = D, g.c_dtype = DType::F32, g.beta = 1.f;
      g.ab = X;
      gemm(g, op);
    }
  }
}

void CudaBackend::attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b, int64_t B,
                                  int64_t T, int64_t H, int64_t D) {
  const char* op = "attention_merge";
  ops::check_attention_merge(kChecks, out, lse, out_b, lse_b, B, T, H, D, op);
  attention_merge_kernel<<<warp_row_blocks(B * H * T, op), 32 * kRowsPerBlock, 0, stream_>>>(
      out.f32(), lse.f32(), out_b.f32(), lse_b.f32(), B, T, H, D);
  check_launch(op);
}

void CudaBackend::copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) {
  const char* op = "copy_columns";
  ops::check_copy_columns(kChecks, src, src_col, dst, dst_col, width, op);
  const int64_t rows = src.dim(0);
  if (rows * width == 0) return;
  copy_columns_kernel<<<grid_for(rows * width, 256), 256, 0, stream_>>>(
      src.raw(), src.dtype(), src.dim(1), src_col, dst.raw(), dst.dtype(), dst.dim(1), dst_col, rows, width, false);
  check_launch(op);
}

}  // namespace gpt
