// Fully connected layer on the CPU: y = x . w^T + b and its gradients, each product one oneDNN matmul
// (cpu_matmul.h). With bf16 weights the products take bf16 operands, any fp32 operand (the LM head's logit
// gradient) rounded to bf16 first, as autocast does, and bf16 outputs (y, dx) written by the product
// itself, rounded once from its fp32 sums, with no fp32 copy; otherwise every operand is read as fp32. The bias is
// an input of the forward product and weight gradients accumulate into dw in the product itself
// (beta = 1), so neither costs a pass of its own.
#include <optional>
#include <vector>

#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_matmul.h"
#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {

using namespace cpu;

namespace {

// The layer's products run in bf16 when its weights are bf16.
bool use_bf16_gemm(const Tensor& w) { return w.dtype() == DType::BF16; }

// Where a product writes: fp32, or a bf16 tensor directly.
struct Destination {
  void* ptr;
  MatType type;
};

// An output tensor as a product's destination: a bf16 tensor of a bf16 product in place, else an fp32
// window (a converted copy for a 16-bit tensor, rounded back by commit()).
class Output {
 public:
  Output(Tensor& t, bool bf16, const char* op, const char* arg) {
    if (bf16 && t.dtype() == DType::BF16) {
      require_float(t, op, arg);
      dest_ = {t.raw(), MatType::BF16};
    } else {
      f32_.emplace(t, false, op, arg);
      dest_ = {f32_->get(), MatType::F32};
    }
  }
  Destination dest() const { return dest_; }
  void commit() {
    if (f32_) f32_->commit();
  }

 private:
  std::optional<F32Output> f32_;
  Destination dest_{};
};

// Row-major C[M,N] = op(A)[M,K] . op(B)[K,N] (+ bias) + beta * C over dense operands (leading dimensions
// follow from the shapes).
void product(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const ProductOperand& a,
             const ProductOperand& b, float beta, Destination c, const float* bias = nullptr) {
  MatmulShape s;
  s.trans_a = trans_a, s.trans_b = trans_b;
  s.M = M, s.N = N, s.K = K;
  s.lda = trans_a ? M : K, s.ldb = trans_b ? K : N, s.ldc = N;
  s.a = s.b = a.bf16() ? MatType::BF16 : MatType::F32;
  s.c = c.type;
  s.beta = beta;
  s.bias = bias != nullptr;
  matmul(s, a.at(), b.at(), c.ptr, bias);
}

// dx[rows, in] = dy . w, dy already read as the product's operand.
void input_gradient(const ops::LinearDims& d, const ProductOperand& dyo, const Tensor& w, bool bf16, Tensor& dx,
                    const char* op) {
  require_numel(dx, d.rows * d.in, op, "dx", shape_str({d.rows, d.in}));
  const ProductOperand wo(w, bf16, op, "w");
  Output dxo(dx, bf16, op, "dx");
  product(false, false, d.rows, d.in, d.out, dyo, wo, 0.f, dxo.dest());  // d.out = 0: zeros
  dxo.commit();
}

}  // namespace

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const char* op = "linear_forward";
  const ops::LinearDims d = ops::check_linear(kChecks, x, w, op);
  require_numel(y, d.rows * d.out, op, "y", shape_str({d.rows, d.out}));
  const bool bf16 = use_bf16_gemm(w);
  const ProductOperand xo(x, bf16, op, "x"), wo(w, bf16, op, "w");
  Output yo(y, bf16, op, "y");
  std::optional<F32Input> bias;
  if (b) {
    require_numel(*b, d.out, op, "b", shape_str({d.out}));
    bias.emplace(*b, op, "b");
  }
  product(false, true, d.rows, d.out, d.in, xo, wo, 0.f, yo.dest(), bias ? bias->get() : nullptr);
  yo.commit();
}

void CpuBackend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor& dw,
                                 Tensor* db) {
  const char* op = "linear_backward";
  const ops::LinearDims d = ops::check_linear(kChecks, x, w, op);
  const std::string out_shape = shape_str({d.rows, d.out});
  require_numel(dy, d.rows * d.out, op, "dy", out_shape);
  require_numel(dw, d.out * d.in, op, "dw", "w's shape " + shape_str(w.shape()));
  const bool bf16 = use_bf16_gemm(w);
  const ProductOperand dyo(dy, bf16, op, "dy"), xo(x, bf16, op, "x");
  const bool work = d.rows > 0 && d.in > 0 && d.out > 0;

  if (dx) input_gradient(d, dyo, w, bf16, *dx, op);

  F32Output dwf(dw, true, op, "dw");
  if (work) product(true, false, d.out, d.in, d.rows, dyo, xo, 1.f, {dwf.get(), MatType::F32});
  dwf.commit();

  if (db) {
    require_numel(*db, d.out, op, "db", shape_str({d.out}));
    F32Output dbf(*db, true, op, "db");  // the bias gradient sums dy in fp32 whatever the products use
    float* dbp = dbf.get();
    // Each thread owns a range of columns and walks every row, so no two threads touch the same sum. The
    // microbatch's column sums are formed first and then added to db, like the beta = 1 products above.
    const int nt = threads_for(d.rows * d.out, 1 << 15);
#pragma omp parallel num_threads(nt)
    {
      int64_t c0, c1;
      chunk_range(d.out, omp_get_thread_num(), omp_get_num_threads(), c0, c1);
      std::vector<float> sums(c1 - c0, 0.f);
      Windows w;
      for (int64_t n = 0; n < d.rows; ++n) {
        const float* row = w.in(0, dy, n * d.out + c0, c1 - c0);  // this thread's columns of the row
#pragma omp simd
        for (int64_t c = 0; c < c1 - c0; ++c) sums[c] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c) dbp[c] += sums[c - c0];
    }
    dbf.commit();
  }
}

}  // namespace gpt

namespace gpt {

std::string CpuBackend::details() const {
  return cpu::matmul_library_version() + " matmul, instruction set " + cpu::matmul_isa();
}

std::string CpuBackend::dtype_warning(DType compute) const {
  if (compute != DType::BF16 || cpu::matmul_has_native_bf16()) return {};
  return "this CPU has no bf16 dot-product instructions (oneDNN runs " + cpu::matmul_isa() +
         "), so bf16 products are emulated or run on fp32 copies and are slower than fp32; use "
         "precision.dtype=fp32 here";
}

void CpuBackend::linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) {
  const char* op = "linear_backward_input";
  const ops::LinearDims d = ops::check_linear(kChecks, dx, w, op);  // dx has the layer input's shape
  require_numel(dy, d.rows * d.out, op, "dy", shape_str({d.rows, d.out}));
  const bool bf16 = use_bf16_gemm(w);
  const ProductOperand dyo(dy, bf16, op, "dy");
  input_gradient(d, dyo, w, bf16, dx, op);
}

}  // namespace gpt
