// cuBLASLt products with fused bias and GELU epilogues, their descriptors and chosen algorithms cached per problem
// (see cublaslt_matmul.h). cuBLASLt is column-major; as in cuda_gemm.cpp the row-major C = op(A) . op(B)
// is run as the column-major C^T = op(B)^T . op(A)^T, so cuBLASLt's "A" is our B and its "B" our A. In
// those terms CUBLASLT_EPILOGUE_BIAS adds a vector along the rows of the column-major D, i.e. along C's
// columns (n elements), and CUBLASLT_EPILOGUE_BGRADB sums cuBLASLt's B (our op(A)) over k into a vector
// of D's column count (m elements). The GELU epilogues' aux matrix has D's layout.
#include "model/ops/cuda/cublaslt_matmul.h"

#include <climits>
#include <string>

#include "model/ops/cuda/cuda_check.h"

namespace gpt::cuda {

namespace {

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// The largest power of two dividing the address, capped at the 256 bytes cuBLASLt assumes by default.
unsigned alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 256;
  const uintptr_t low = v & (~v + 1);
  return low >= 256 ? 256u : static_cast<unsigned>(low);
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value, const char* op) {
  check_cublas(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof value), op, "cublasLtMatmulDescSetAttribute");
}

template <typename T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& value,
              const char* op) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof value), op,
               "cublasLtMatmulPreferenceSetAttribute");
}

// A column-major layout of `rows` x `cols` stored with leading dimension `ld`.
cublasLtMatrixLayout_t make_layout(DType t, int64_t rows, int64_t cols, int64_t ld, const char* op) {
  cublasLtMatrixLayout_t layout = nullptr;
  check_cublas(cublasLtMatrixLayoutCreate(&layout, lt_type(t), static_cast<uint64_t>(rows),
                                          static_cast<uint64_t>(cols), ld),
               op, "cublasLtMatrixLayoutCreate");
  return layout;
}

}  // namespace

struct LtMatmulCache::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // the heuristic offered an algorithm
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

LtMatmulCache::LtMatmulCache(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  check_cublas(cublasLtCreate(&handle_), "CudaBackend", "cublasLtCreate");
}

LtMatmulCache::~LtMatmulCache() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

size_t LtMatmulCache::plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

LtMatmulCache::Plan& LtMatmulCache::plan(const LtProblem& p, const Key& key, const char* op) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_cublas(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F), op, "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const cublasOperation_t op_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a, op);
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b, op);
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (p.epilogue == LtEpilogue::Bias) epilogue = CUBLASLT_EPILOGUE_BIAS;
  if (p.epilogue == LtEpilogue::GradA) epilogue = CUBLASLT_EPILOGUE_BGRADB;
  if (p.epilogue == LtEpilogue::GeluAux) epilogue = p.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (p.epilogue == LtEpilogue::DGelu) epilogue = CUBLASLT_EPILOGUE_DGELU;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, op);
  if (p.bias) {
    const cudaDataType_t bias_type = lt_type(p.bias_dtype);
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, op);
  }
  if (p.aux) {  // the aux matrix has D's layout: column-major n x m, leading dimension ldc
    const int64_t aux_ld = p.ldc;
    const cudaDataType_t aux_type = lt_type(p.c_dtype);
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld, op);
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type, op);
  }
  // Stored (pre-transpose) shapes: our B is [k, n] row-major = column-major n x k, or [n, k] when
  // transposed; likewise our A; C [m, n] row-major is column-major n x m.
  plan->a = p.trans_b ? make_layout(p.ab, p.k, p.n, p.ldb, op) : make_layout(p.ab, p.n, p.k, p.ldb, op);
  plan->b = p.trans_a ? make_layout(p.ab, p.m, p.k, p.lda, op) : make_layout(p.ab, p.k, p.m, p.lda, op);
  plan->c = make_layout(p.c_dtype, p.n, p.m, p.ldc, op);

  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), op, "cublasLtMatmulPreferenceCreate");
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint64_t workspace = workspace_bytes_;
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace, op);
  const uint32_t align_a = std::get<14>(key), align_b = std::get<13>(key), align_c = std::get<15>(key);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a, op);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b, op);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c, op);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c, op);
  if (p.c_dtype != DType::F32) {
    // As the cuBLAS handle's CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: split-K partial sums stay
    // in fp32 (the compute type) rather than being reduced in the 16-bit output.
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    set_pref(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, schemes, op);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->c,
                                                          pref, 1, &result, &found);
  // Any failure of the heuristic (NOT_SUPPORTED, or INVALID_VALUE for an epilogue and bias type some
  // versions do not take) means "no plan": the caller falls back to cublasGemmEx.
  (void)op;
  if (s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->found = true;
  }
  return *plans_.emplace(key, std::move(plan)).first->second;
}

bool LtMatmulCache::run(const LtProblem& p, cudaStream_t stream, const char* op) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) return false;
  if (p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX) return false;
  if (p.c_dtype != p.ab && p.c_dtype != DType::F32) return false;
  const bool needs_bias = p.epilogue == LtEpilogue::Bias || p.epilogue == LtEpilogue::GradA;
  const bool needs_aux = p.epilogue == LtEpilogue::GeluAux || p.epilogue == LtEpilogue::DGelu;
  if (needs_bias && p.bias == nullptr) return false;
  if (p.bias && (p.epilogue == LtEpilogue::None || p.epilogue == LtEpilogue::DGelu || alignment(p.bias) < 16))
    return false;
  if (needs_aux && (p.aux == nullptr || alignment(p.aux) < 16 || p.ldc % 8 != 0 || p.beta != 0.f)) return false;
  const Key key{p.trans_a,
                p.trans_b,
                p.m,
                p.n,
                p.k,
                p.lda,
                p.ldb,
                p.ldc,
                static_cast<int>(p.ab),
                static_cast<int>(p.c_dtype),
                p.bias ? static_cast<int>(p.bias_dtype) : -1,
                p.tf32,
                static_cast<int>(p.epilogue),
                alignment(p.a),
                alignment(p.b),
                alignment(p.c)};
  std::lock_guard<std::mutex> lock(mu_);
  Plan& plan = this->plan(p, key, op);
  if (!plan.found) return false;
  if (p.bias) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, op);
  if (p.aux) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux, op);
  const float alpha = 1.f;
  const cublasStatus_t s = cublasLtMatmul(handle_, plan.desc, &alpha, p.b, plan.a, p.a, plan.b, &p.beta, p.c, plan.c,
                                          p.c, plan.c, &plan.algo, workspace_, workspace_bytes_, stream);
  // NOT_SUPPORTED, or for an epilogue INVALID_VALUE (a pointer its algorithm cannot take): never try this
  // problem on cuBLASLt again; the caller's fallback runs.
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_INVALID_VALUE && p.epilogue != LtEpilogue::None)) {
    plan.found = false;
    return false;
  }
  check_cublas(s, op, "cublasLtMatmul");
  return true;
}

}  // namespace gpt::cuda
