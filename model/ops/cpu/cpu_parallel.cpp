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
  if (M <= 0 || N <= 0) return;
  // About a million multiply-adds per thread before splitting pays for itself.
  constexpr int64_t kGrain = 1 << 20;
  constexpr int64_t kAlign = 16;  // slab edges on whole vector/cache-line multiples
  const bool split_m = M >= N;
  const int64_t extent = split_m ? M : N;
  const int nt = static_cast<int>(std::min<int64_t>(threads_for(M * N * std::max<int64_t>(K, 1), kGrain),
                                                    (extent + kAlign - 1) / kAlign));
  SingleThreadedBlas blas_guard;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t per = ((extent + count - 1) / count + kAlign - 1) / kAlign * kAlign;
    const int64_t lo = std::min(extent, t * per), hi = std::min(extent, lo + per);
    if (hi > lo) {
      if (split_m) {
        const float* a = trans_a == CblasNoTrans ? A + lo * lda : A + lo;
        cblas_sgemm(CblasRowMajor, trans_a, trans_b, hi - lo, N, K, alpha, a, lda, B, ldb, beta, C + lo * ldc, ldc);
      } else {
        const float* b = trans_b == CblasNoTrans ? B + lo : B + lo * ldb;
        cblas_sgemm(CblasRowMajor, trans_a, trans_b, M, hi - lo, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
      }
    }
  }
}

}  // namespace gpt::cpu
