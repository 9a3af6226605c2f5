// Fully connected layer on the GPU: y = x . w^T + b and its gradients. Each product runs on cuBLASLt
// (cublaslt_matmul.cpp) with the bias fused into its epilogue: the forward product adds b in fp32 before
// the single rounding to y's dtype (CUBLASLT_EPILOGUE_BIAS), and the weight-gradient product dw += dy^T . x
// also yields db's increment, the column sums of dy (CUBLASLT_EPILOGUE_BGRADB), which it writes into an
// fp32 scratch that is then added into db, since the contract accumulates db and cuBLASLt overwrites.
// Where cuBLASLt has no algorithm for a problem the cublasGemmEx path (cuda_gemm.cpp) runs instead: the
// bias pre-filled into y and the product run with beta = 1, and db as a deterministic column sum
// (cuda_reduce.cu). Operands of different dtypes meet in the narrower one: an F32 operand next to a
// BF16/F16 one is cast to the 16-bit dtype (e.g. the LM head's fp32 logit gradient against bf16 weights,
// as Megatron does), BF16 next to F16 meets in F32. The bias is used in y's dtype on both paths.
// The MLP's fc1 + GELU and fc2's input gradient through GELU run as one product each where cuBLASLt takes
// them: GELU_AUX(_BIAS) writes act = gelu(x . w^T + b) and stores pre = x . w^T + b as its aux output;
// DGELU writes dpre = (dy . w) * gelu'(pre) from the stored pre. fc1's bias gradient then comes from fc1's
// weight-gradient product (BGRADB over dpre), so DGELU_BGRAD would only compute it twice. Where cuBLASLt
// declines (a dtype, an alignment, a leading dimension not a multiple of 8) the composed ops run instead,
// and always in fp32: cuBLASLt does not document its GELU's arithmetic, and fp32 runs are the ones compared
// with the CPU to 1e-4 and better, so they keep the exact GELU kernels.
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

// The forward product y[N, out] = x[N, in] . w[out, in]^T, x and w of dtype ab.
CudaBackend::GemmArgs forward_product(const ops::LinearDims& d, const Tensor& xa, const Tensor& wa, DType ab,
                                      Tensor& y) {
  CudaBackend::GemmArgs g;
  g.m = d.rows, g.n = d.out, g.k = d.in;
  g.a = xa.raw(), g.lda = d.in;
  g.b = wa.raw(), g.ldb = d.in, g.trans_b = true;
  g.c = y.raw(), g.ldc = d.out, g.c_dtype = y.dtype();
  g.ab = ab;
  return g;
}

// The input-gradient product dx[N, in] = dy[N, out] . w[out, in], dy and w of dtype ab.
CudaBackend::GemmArgs input_grad_product(const ops::LinearDims& d, const Tensor& dya, const Tensor& wa, DType ab,
                                         Tensor& dx) {
  CudaBackend::GemmArgs g;
  g.m = d.rows, g.n = d.in, g.k = d.out;
  g.a = dya.raw(), g.lda = d.out;
  g.b = wa.raw(), g.ldb = d.in;
  g.c = dx.raw(), g.ldc = d.in, g.c_dtype = dx.dtype();
  g.ab = ab;
  return g;
}

}  // namespace

void CudaBackend::broadcast_bias(const Tensor& b, Tensor& y, int64_t rows, int64_t out, const char* op) {
  if (rows * out == 0) return;
  broadcast_rows_kernel<<<grid_for(rows * out, 256), 256, 0, stream_>>>(b.raw(), b.dtype(), y.raw(), y.dtype(), rows,
                                                                        out);
  check_launch(op);
}

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const char* op = "linear_forward";
  const ops::LinearDims d = ops::check_linear(kChecks, x, w, op);
  require_float(y, op, "y");
  require_numel(y, d.rows * d.out, op, "y", shape_str({d.rows, d.out}));
  if (b) {
    require_float(*b, op, "b");
    require_numel(*b, d.out, op, "b", shape_str({d.out}));
  }
  if (d.rows == 0 || d.out == 0) return;
  if (d.in == 0) {  // an empty sum
    if (b)
      broadcast_bias(*b, y, d.rows, d.out, op);
    else
      fill(y, 0.f);
    return;
  }
  const DType ab = product_dtype(x.dtype(), w.dtype());
  Tensor xa = as_dtype(x, ab), wa = as_dtype(w, ab);
  GemmArgs g = forward_product(d, xa, wa, ab, y);
  if (b) {
    Tensor bias = as_dtype(*b, y.dtype());
    if (lt_gemm(g, LtEpilogue::Bias, bias.raw(), bias.dtype(), op)) return;
    broadcast_bias(bias, y, d.rows, d.out, op);
    g.beta = 1.f;
  } else if (lt_gemm(g, LtEpilogue::None, nullptr, DType::F32, op)) {
    return;
  }
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
  if (dx) {
    require_float(*dx, op, "dx");
    require_numel(*dx, d.rows * d.in, op, "dx", "x's shape " + shape_str(x.shape()));
  }
  if (db) {
    require_float(*db, op, "db");
    require_numel(*db, d.out, op, "db", shape_str({d.out}));
  }
  const bool work = d.rows > 0 && d.in > 0 && d.out > 0;
  // dy in the dtype of each product, converted at most once per dtype.
  const DType ab_dx = product_dtype(dy.dtype(), w.dtype()), ab_dw = product_dtype(dy.dtype(), x.dtype());
  Tensor dy_dw = work ? as_dtype(dy, ab_dw) : dy;
  Tensor dy_dx = ab_dx == ab_dw ? dy_dw : (work && dx ? as_dtype(dy, ab_dx) : dy);

  if (dx) input_gradient(d, dy_dx, w, ab_dx, *dx, op);

  bool db_done = false;
  if (work) {
    Tensor xa = as_dtype(x, ab_dw);
    GemmArgs g;  // dw[out, in] += dy^T . x
    g.m = d.out, g.n = d.in, g.k = d.rows;
    g.a = dy_dw.raw(), g.lda = d.out, g.trans_a = true;
    g.b = xa.raw(), g.ldb = d.in;
    g.c = dw.raw(), g.ldc = d.in, g.c_dtype = dw.dtype();
    g.ab = ab_dw, g.beta = 1.f;
    if (db && ab_dw == dy.dtype()) {
      // The epilogue sums the dy operand the product reads, so only where that is dy itself, not a
      // 16-bit copy of an fp32 dy (db would then sum rounded values; the column sum below reads dy).
      Tensor db_step = empty(db->shape(), DType::F32);
      fill(db_step, 0.f);  // cuBLASLt documents BGRADB as storing; zeroed so that adding would be right too
      if (lt_gemm(g, LtEpilogue::GradA, db_step.raw(), DType::F32, op)) {
        accumulate(db_step, *db);
        db_done = true;
      }
    }
    if (!db_done && !lt_gemm(g, LtEpilogue::None, nullptr, DType::F32, op)) gemm(g, op);
  }

  if (db && !db_done && d.rows > 0 && d.out > 0) {
    const int64_t chunks = column_sum_chunks(d.rows, op);
    Tensor partials = empty({chunks, d.out});
    column_partial_sums(dy.raw(), dy.dtype(), d.rows, d.out, partials.f32(), stream_);
    add_partial_sums(partials.f32(), chunks, d.out, db->raw(), db->dtype(), stream_);
  }
}

void CudaBackend::input_gradient(const ops::LinearDims& d, const Tensor& dy, const Tensor& w, DType ab, Tensor& dx,
                                 const char* op) {
  if (d.rows > 0 && d.in > 0 && d.out > 0) {
    Tensor wa = as_dtype(w, ab);
    GemmArgs g = input_grad_product(d, dy, wa, ab, dx);
    if (!lt_gemm(g, LtEpilogue::None, nullptr, DType::F32, op)) gemm(g, op);
  } else {
    fill(dx, 0.f);
  }
}

void CudaBackend::linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) {
  const char* op = "linear_backward_input";
  const ops::LinearDims d = ops::check_linear(kChecks, dx, w, op);  // dx has the layer input's shape
  require_float(dy, op, "dy");
  require_numel(dy, d.rows * d.out, op, "dy", shape_str({d.rows, d.out}));
  require_float(dx, op, "dx");
  const DType ab = product_dtype(dy.dtype(), w.dtype());
  const bool work = d.rows > 0 && d.in > 0 && d.out > 0;
  input_gradient(d, work ? as_dtype(dy, ab) : dy, w, ab, dx, op);
}

void CudaBackend::linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& pre, Tensor& act) {
  const char* op = "linear_gelu_forward";
  const ops::LinearDims d = ops::check_linear(kChecks, x, w, op);
  require_float(pre, op, "pre");
  require_float(act, op, "act");
  require_numel(pre, d.rows * d.out, op, "pre", shape_str({d.rows, d.out}));
  require_numel(act, d.rows * d.out, op, "act", shape_str({d.rows, d.out}));
  if (d.rows == 0 || d.out == 0) return;
  if (d.in > 0 && pre.dtype() == act.dtype() && act.dtype() != DType::F32) {
    const DType ab = product_dtype(x.dtype(), w.dtype());
    Tensor xa = as_dtype(x, ab), wa = as_dtype(w, ab);
    Tensor bias = b ? as_dtype(*b, act.dtype()) : Tensor();
    GemmArgs g = forward_product(d, xa, wa, ab, act);  // act = gelu(x . w^T + b), pre stored on the way
    if (lt_gemm(g, LtEpilogue::GeluAux, b ? bias.raw() : nullptr, act.dtype(), op, pre.raw())) {
      ++gelu_epilogue_products_;
      return;
    }
  }
  Backend::linear_gelu_forward(x, w, b, pre, act);
}

void CudaBackend::linear_dgelu_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre,
                                        Tensor& dpre, Tensor& dw, Tensor* db) {
  const char* op = "linear_dgelu_backward";
  const ops::LinearDims d = ops::check_linear(kChecks, x, w, op);
  require_float(dy, op, "dy");
  require_numel(dy, d.rows * d.out, op, "dy", shape_str({d.rows, d.out}));
  require_float(pre, op, "pre");
  require_float(dpre, op, "dpre");
  require_numel(pre, d.rows * d.in, op, "pre", "x's shape " + shape_str(x.shape()));
  require_numel(dpre, d.rows * d.in, op, "dpre", "x's shape " + shape_str(x.shape()));
  if (d.rows > 0 && d.in > 0 && d.out > 0 && pre.dtype() == dpre.dtype() && dpre.dtype() != DType::F32) {
    const DType ab = product_dtype(dy.dtype(), w.dtype());
    Tensor dya = as_dtype(dy, ab), wa = as_dtype(w, ab);
    GemmArgs g = input_grad_product(d, dya, wa, ab, dpre);  // dpre = (dy . w) * gelu'(pre)
    if (lt_gemm(g, LtEpilogue::DGelu, nullptr, DType::F32, op, const_cast<void*>(pre.raw()))) {
      ++gelu_epilogue_products_;
      linear_backward(dy, x, w, nullptr, dw, db);  // dw and db only
      return;
    }
  }
  Backend::linear_dgelu_backward(dy, x, w, pre, dpre, dw, db);
}

}  // namespace gpt
