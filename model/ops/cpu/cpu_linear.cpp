// Fully connected layer on the CPU: y = x . w^T + b and its gradients, each product one parallel_sgemm
// (OpenBLAS per thread slab, see cpu_parallel.h). The bias is folded in by pre-filling y with it and
// running the product with beta = 1; weight gradients accumulate the same way (beta = 1).
#include <cblas.h>

#include <vector>

#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {

using namespace cpu;

namespace {

struct LinearDims {
  int64_t rows, in, out;
};

LinearDims linear_dims(const Tensor& x, const Tensor& w, const char* op) {
  require_float(x, op, "x");
  require_float(w, op, "w");
  require(w.ndim() == 2, op, "w must be [out, in], got " + describe(w));
  const int64_t in = w.dim(1), out = w.dim(0);
  require(x.ndim() >= 1 && x.dim(-1) == in, op,
          "x " + describe(x) + " does not end in w's in-features " + std::to_string(in) + " (w " + describe(w) + ")");
  return {in == 0 ? 0 : x.numel() / in, in, out};
}

}  // namespace

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const char* op = "linear_forward";
  const LinearDims d = linear_dims(x, w, op);
  require_numel(y, d.rows * d.out, op, "y", shape_str({d.rows, d.out}));
  F32Input xf(x, op, "x"), wf(w, op, "w");
  F32Output yf(y, false, op, "y");
  float* yp = yf.get();
  float beta = 0.f;
  if (b) {
    require_numel(*b, d.out, op, "b", shape_str({d.out}));
    F32Input bf(*b, op, "b");
    const float* bp = bf.get();
#pragma omp parallel for schedule(static) if (d.rows * d.out > (1 << 16))
    for (int64_t n = 0; n < d.rows; ++n) {
      float* row = yp + n * d.out;
      for (int64_t o = 0; o < d.out; ++o) row[o] = bp[o];
    }
    beta = 1.f;
  }
  if (d.rows > 0 && d.out > 0) {
    if (d.in > 0) {
      parallel_sgemm(CblasNoTrans, CblasTrans, d.rows, d.out, d.in, 1.f, xf.get(), d.in, wf.get(), d.in,
                  beta, yp, d.out);
    } else if (!b) {
      for (int64_t i = 0; i < d.rows * d.out; ++i) yp[i] = 0.f;  // empty sum
    }
  }
  yf.commit();
}

void CpuBackend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor& dw,
                                 Tensor* db) {
  const char* op = "linear_backward";
  const LinearDims d = linear_dims(x, w, op);
  const std::string out_shape = shape_str({d.rows, d.out});
  require_numel(dy, d.rows * d.out, op, "dy", out_shape);
  require_numel(dw, d.out * d.in, op, "dw", "w's shape " + shape_str(w.shape()));
  F32Input dyf(dy, op, "dy"), xf(x, op, "x");
  const float* dyp = dyf.get();
  const bool work = d.rows > 0 && d.in > 0 && d.out > 0;

  if (dx) {
    require_numel(*dx, d.rows * d.in, op, "dx", "x's shape " + shape_str(x.shape()));
    F32Input wf(w, op, "w");
    F32Output dxf(*dx, false, op, "dx");
    if (work) {
      parallel_sgemm(CblasNoTrans, CblasNoTrans, d.rows, d.in, d.out, 1.f, dyp, d.out, wf.get(), d.in,
                  0.f, dxf.get(), d.in);
    } else {
      for (int64_t i = 0; i < d.rows * d.in; ++i) dxf.get()[i] = 0.f;
    }
    dxf.commit();
  }

  F32Output dwf(dw, true, op, "dw");
  if (work) {
    parallel_sgemm(CblasTrans, CblasNoTrans, d.out, d.in, d.rows, 1.f, dyp, d.out, xf.get(), d.in, 1.f,
                dwf.get(), d.in);
  }
  dwf.commit();

  if (db) {
    require_numel(*db, d.out, op, "db", shape_str({d.out}));
    F32Output dbf(*db, true, op, "db");
    float* dbp = dbf.get();
    // Each thread owns a range of columns and walks every row, so no two threads touch the same sum. The
    // microbatch's column sums are formed first and then added to db, like the beta = 1 products above.
    const int nt = threads_for(d.rows * d.out, 1 << 15);
#pragma omp parallel num_threads(nt)
    {
      int64_t c0, c1;
      chunk_range(d.out, omp_get_thread_num(), omp_get_num_threads(), c0, c1);
      std::vector<float> sums(c1 - c0, 0.f);
      for (int64_t n = 0; n < d.rows; ++n) {
        const float* row = dyp + n * d.out;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) sums[c - c0] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c) dbp[c] += sums[c - c0];
    }
    dbf.commit();
  }
}

}  // namespace gpt
