// Threading helpers shared by the CPU kernels. All parallelism comes from the OpenMP pool: OpenBLAS (the
// pthread build, with its own pool) is pinned to one thread around every call we make, and large products
// are split into per-thread slabs by parallel_sgemm instead, so two pools never compete for the cores.
// Reductions are split into fixed contiguous chunks per thread and combined in thread order, so results
// do not change from run to run.
#pragma once
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace gpt::cpu {

// While alive, every BLAS call runs on the calling thread only.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

// Number of threads worth using for `n` units of work when each thread should get at least `grain`.
inline int threads_for(int64_t n, int64_t grain) {
  const int64_t useful = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), useful));
}

// Splits an M x N x K product over the OpenMP threads along the larger of M and N (slab edges on multiples
// of 16, about a million multiply-adds per thread at least) and calls body(split_m, lo, hi) on each thread
// with its slab [lo, hi) of rows (split_m) or columns.
template <class Body>
void for_each_product_slab(int64_t M, int64_t N, int64_t K, Body&& body) {
  if (M <= 0 || N <= 0) return;
  constexpr int64_t kGrain = 1 << 20;
  constexpr int64_t kAlign = 16;
  const bool split_m = M >= N;
  const int64_t extent = split_m ? M : N;
  const int nt = static_cast<int>(std::min<int64_t>(threads_for(M * N * std::max<int64_t>(K, 1), kGrain),
                                                    (extent + kAlign - 1) / kAlign));
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t per = ((extent + count - 1) / count + kAlign - 1) / kAlign * kAlign;
    const int64_t lo = std::min(extent, t * per), hi = std::min(extent, lo + per);
    if (hi > lo) body(split_m, lo, hi);
  }
}

// Row-major C = alpha * op(A) . op(B) + beta * C, split over OpenMP threads along the larger of M and N;
// each thread runs a single-threaded cblas_sgemm on its slab, so only the OpenMP pool is ever busy.
void parallel_sgemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The contiguous sub-range of [0, n) that thread `t` of `nt` owns.
inline void chunk_range(int64_t n, int t, int nt, int64_t& begin, int64_t& end) {
  begin = n * t / nt;
  end = n * (t + 1) / nt;
}

}  // namespace gpt::cpu
