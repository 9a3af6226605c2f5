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

// Calls f(lo, hi) on consecutive chunks of [0, n) (16 Ki elements each), spread over the OpenMP threads
// when n exceeds `parallel_above`: for element-wise kernels compiled per instruction set
// (cpu_dispatch.h), which are called once per chunk.
template <class F>
void for_each_chunk(int64_t n, int64_t parallel_above, F&& f) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > parallel_above)
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(n, (c + 1) * kChunk));
}

// The contiguous sub-range of [0, n) that thread `t` of `nt` owns.
inline void chunk_range(int64_t n, int t, int nt, int64_t& begin, int64_t& end) {
  begin = n * t / nt;
  end = n * (t + 1) / nt;
}

}  // namespace gpt::cpu
