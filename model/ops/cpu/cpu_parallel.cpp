// SingleThreadedBlas (save OpenBLAS's thread count, drop it to one, restore it on scope exit) and
// parallel_sgemm, which splits one product into per-thread slabs. Keeping every thread in the OpenMP pool
// matters on small machines: OpenBLAS's worker threads keep spinning for a while after each call and
// would otherwise compete for the cores with the OpenMP loops that run between the products.
#include "model/ops/cpu/cpu_parallel.h"

namespace gpt::cpu {

SingleThreadedBlas::SingleThreadedBlas() : saved_(openblas_get_num_threads()) {
  if (saved_ != 1) openblas_set_num_threads(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (saved_ != 1) openblas_set_num_threads(saved_);
}

void parallel_sgemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  SingleThreadedBlas blas_guard;
  for_each_product_slab(M, N, K, [&](bool split_m, int64_t lo, int64_t hi) {
    if (split_m) {
      const float* a = trans_a == CblasNoTrans ? A + lo * lda : A + lo;
      cblas_sgemm(CblasRowMajor, trans_a, trans_b, hi - lo, N, K, alpha, a, lda, B, ldb, beta, C + lo * ldc, ldc);
    } else {
      const float* b = trans_b == CblasNoTrans ? B + lo : B + lo * ldb;
      cblas_sgemm(CblasRowMajor, trans_a, trans_b, M, hi - lo, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
    }
  });
}

}  // namespace gpt::cpu
