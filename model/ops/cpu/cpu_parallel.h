// Threading helpers shared by the CPU kernels. All parallelism comes from the OpenMP pool, which oneDNN's
// products (cpu_matmul.h) use too, so two pools never compete for the cores. Reductions are split into
// fixed contiguous chunks per thread and combined in thread order, so results do not change from run to
// run.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace gpt::cpu {

// Number of threads worth using for `n` units of work when each thread should get at least `grain`.
inline int threads_for(int64_t n, int64_t grain) {
  const int64_t useful = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), useful));
}

// The contiguous sub-range of [0, n) that thread `t` of `nt` owns.
inline void chunk_range(int64_t n, int t, int nt, int64_t& begin, int64_t& end) {
  begin = n * t / nt;
  end = n * (t + 1) / nt;
}

}  // namespace gpt::cpu
