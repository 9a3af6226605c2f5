// Fully connected layer on the GPU: y = x . w^T + b and its gradients, each product one cuBLAS call
// (cuda_gemm.cpp). The bias is folded in by pre-filling y with it and running the product with beta = 1,
// which adds it in fp32 before the single rounding to y's dtype; weight gradients accumulate the same way.
// Operands of different dtypes meet in the narrower one: an F32 operand next to a BF16/F16 one is cast
// to the 16-bit dtype (e.g. the LM head's fp32 logit gradient against bf16 weights, as Megatron does),
// BF16 next to F16 meets in F32. The bias gradient is a deterministic column sum (cuda_reduce.cu).
#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_half.cuh"
#include "model/ops/cuda/cuda_launch.h"

namespace gpt {

using namespace cuda;

namespace {

DType product_dtype(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::F32) return b;
  if (b == DType::F32) return a;
  return DType::F32;
}

// y[r, o] = b[o] for a [rows, out] y.
__global__ void broadcast_rows_kernel(const void* b, DType bd, void* y, DType yd, int64_t rows, int64_t out) {
  const int64_t n = rows * out;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_from_f32(y, yd, i, load_as_f32(b, bd, i % out));
}

}  // namespace

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const char* op = "linear_forward";
  const ops::LinearDims d = ops::check_linear(kChecks, x, w, op);
  require_float(y, op, "y");
  require_numel(y, d.rows * d.out, op, "y", shape_str({d.rows, d.out}));
  float beta = 0.f;
  if (b) {
    require_float(*b, op, "b");
    require_numel(*b, d.out, op, "b", shape_str({d.out}));
    if (d.rows * d.out > 0) {
      broadcast_rows_kernel<<<grid_for(d.rows * d.out, 256), 256, 0, stream_>>>(b->raw(), b->dtype(), y.raw(),
                                                                                y.dtype(), d.rows, d.out);
      check_launch(op);
    }
    beta = 1.f;
  }
  if (d.rows == 0 || d.out == 0) return;
  if (d.in == 0) {
    if (!b) fill(y, 0.f);  // empty sum
    return;
  }
  const DType ab = product_dtype(x.dtype(), w.dtype());
  Tensor xa = as_dtype(x, ab), wa = as_dtype(w, ab);
  GemmArgs g;
  g.m = d.rows, g.n = d.out, g.k = d.in;
  g.a = xa.raw(), g.lda = d.in;
  g.b = wa.raw(), g.ldb = d.in, g.trans_b = true;
  g.c = y.raw(), g.ldc = d.out, g.c_dtype = y.dtype();
  g.ab = ab, g.beta = beta;
  gemm(g, op);
}

void CudaBackend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor& dw,
                                  Tensor* db) {
  const char* op = "linear_backward";
  const ops::LinearDims d = ops::check_linear(kChecks, x, w, op);
  require_float(dy, op, "dy");
  require_numel(dy, d.rows * d.out, op, "dy", shape_str({d.rows, d.out}));
  require_float(dw, op, "dw");
  require_numel(dw, d.out * d.in, op, "dw", "w's shape " + shape_str(w.shape()));
  const bool work = d.rows > 0 && d.in > 0 && d.out > 0;
  // dy in the dtype of each product, converted at most once per dtype.
  const DType ab_dx = product_dtype(dy.dtype(), w.dtype()), ab_dw = product_dtype(dy.dtype(), x.dtype());
  Tensor dy_dw = work ? as_dtype(dy, ab_dw) : dy;
  Tensor dy_dx = ab_dx == ab_dw ? dy_dw : (work && dx ? as_dtype(dy, ab_dx) : dy);

  if (dx) {
    require_float(*dx, op, "dx");
    require_numel(*dx, d.rows * d.in, op, "dx", "x's shape " + shape_str(x.shape()));
    if (work) {
      Tensor wa = as_dtype(w, ab_dx);
      GemmArgs g;  // dx[N, in] = dy[N, out] . w[out, in]
      g.m = d.rows, g.n = d.in, g.k = d.out;
      g.a = dy_dx.raw(), g.lda = d.out;
      g.b = wa.raw(), g.ldb = d.in;
      g.c = dx->raw(), g.ldc = d.in, g.c_dtype = dx->dtype();
      g.ab = ab_dx;
      gemm(g, op);
    } else {
      fill(*dx, 0.f);
    }
  }

  if (work) {
    Tensor xa = as_dtype(x, ab_dw);
    GemmArgs g;  // dw[out, in] += dy^T . x
    g.m = d.out, g.n = d.in, g.k = d.rows;
    g.a = dy_dw.raw(), g.lda = d.out, g.trans_a = true;
    g.b = xa.raw(), g.ldb = d.in;
    g.c = dw.raw(), g.ldc = d.in, g.c_dtype = dw.dtype();
    g.ab = ab_dw, g.beta = 1.f;
    gemm(g, op);
  }

  if (db) {
    require_float(*db, op, "db");
    require_numel(*db, d.out, op, "db", shape_str({d.out}));
    if (d.rows > 0 && d.out > 0) {
      const int64_t chunks = column_sum_chunks(d.rows);
      Tensor partials = empty({chunks, d.out});
      column_partial_sums(dy.raw(), dy.dtype(), d.rows, d.out, partials.f32(), stream_);
      add_partial_sums(partials.f32(), chunks, d.out, db->raw(), db->dtype(), stream_);
    }
  }
}

}  // namespace gpt
