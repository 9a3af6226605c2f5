// Matrix products on cuBLASLt for the linear layers, with the bias and GELU fused into the product's
// epilogue: CUBLASLT_EPILOGUE_BIAS adds the bias in the forward product, CUBLASLT_EPILOGUE_BGRADB writes
// the bias gradient as a by-product of the weight-gradient product, CUBLASLT_EPILOGUE_GELU_AUX(_BIAS)
// applies GELU and also stores its input (the "aux" matrix), CUBLASLT_EPILOGUE_DGELU multiplies the
// product by GELU's derivative at a stored aux. Problems are stated row-major, like
// CudaBackend::GemmArgs (cuda_gemm.cpp): C[m, n] = op(A)[m, k] . op(B)[k, n] + beta * C, A and B of one dtype,
// fp32 accumulation (TF32 when asked), C either of A's dtype or F32.
//
// cuBLASLt asks for a matmul descriptor, four matrix layouts and a heuristic query per problem; those are
// built once per (shape, leading dimensions, dtypes, transposes, epilogue, pointer alignment) and kept, so
// a training step that repeats the previous step's shapes only sets the bias pointer and launches. When
// the heuristic offers no algorithm the cache remembers that too, and run() returns false without writing
// anything so the caller can take the cublasGemmEx path.
//
// One cache per device, shared by every CudaBackend there (the context in cuda_backend.cpp); a mutex
// guards it. It borrows the context's cuBLAS workspace: both libraries run on the device's one compute
// stream, so their uses of it are ordered.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "model/tensor.h"

namespace gpt::cuda {

enum class LtEpilogue : int {
  None = 0,
  Bias = 1,   // C[i, j] += bias[j] (bias of n elements), added in fp32 before C is rounded
  GradA = 2,  // also bias[i] = sum over k of op(A)[i, k] (m elements), written, not accumulated
  GeluAux = 3,      // C = gelu(product (+ bias[j] when bias is set)); aux = the GELU input, C's shape
  DGelu = 4,        // C = product * gelu'(aux), aux of C's shape (read)
};

struct LtProblem {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  DType ab = DType::F32, c_dtype = DType::F32;
  float beta = 0.f;
  bool tf32 = false;
  LtEpilogue epilogue = LtEpilogue::None;
  void* bias = nullptr;  // Bias, GeluAux: read; GradA: written
  DType bias_dtype = DType::F32;
  void* aux = nullptr;  // GeluAux: written; DGelu: read. C's dtype, leading dimension ldc
};

class LtMatmulCache {
 public:
  // Creates the cuBLASLt handle on the current device; `workspace` (of `workspace_bytes`) is borrowed.
  LtMatmulCache(void* workspace, size_t workspace_bytes);
  ~LtMatmulCache();
  LtMatmulCache(const LtMatmulCache&) = delete;
  LtMatmulCache& operator=(const LtMatmulCache&) = delete;

  // Enqueues the product on `stream`. False (and nothing enqueued) when cuBLASLt has no algorithm for the
  // problem or does not support it; throws on any other cuBLASLt failure, naming `op`.
  bool run(const LtProblem& p, cudaStream_t stream, const char* op);

  size_t plans() const;  // problems seen so far (for tests)

 private:
  // trans_a, trans_b, m, n, k, lda, ldb, ldc, ab, c, bias dtype, tf32, epilogue, and the alignments of a, b, c
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, bool, int,
                         unsigned, unsigned, unsigned>;
  struct Plan;
  Plan& plan(const LtProblem& p, const Key& key, const char* op);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  mutable std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace gpt::cuda
