// Token and learned-position embeddings on the CPU. The token table may be one vocab-parallel shard: ids
// outside [vocab_start, vocab_start + rows) produce zero rows (another rank holds them) and receive no
// gradient. Gradient scatters are parallel over embedding columns, so repeated ids never race and the
// summation order is fixed.
#include <cstring>
#include <vector>

#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {

using namespace cpu;

namespace {

void require_ids(const Tensor& ids, const char* op) {
  require_dtype(ids, DType::I32, op, "ids");
}

}  // namespace

void CpuBackend::embedding_forward(const Tensor& ids, const Tensor& table, int64_t vocab_start, Tensor& out) {
  const char* op = "embedding_forward";
  require_ids(ids, op);
  ops::check_table(kChecks, table, op, "table");
  require_float(out, op, "out");
  const int64_t N = ids.numel(), rows = table.dim(0), C = table.dim(1);
  require_numel(out, N * C, op, "out", shape_str({N, C}));
  const int32_t* idp = ids.i32();
  for (int64_t n = 0; n < N; ++n)
    require(idp[n] >= 0, op, "negative token id " + std::to_string(idp[n]) + " at position " + std::to_string(n));

  const DType td = table.dtype(), od = out.dtype();
  const size_t tsize = dtype_size(td), osize = dtype_size(od);
  const char* tp = static_cast<const char*>(table.raw());
  char* outp = static_cast<char*>(out.raw());
#pragma omp parallel if (N * C > (1 << 15))
  {
    std::vector<float> row;  // staging for a dtype change
    if (td != od) row.resize(C);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t local = static_cast<int64_t>(idp[n]) - vocab_start;
      char* dst = outp + n * C * osize;
      if (local < 0 || local >= rows) {
        std::memset(dst, 0, C * osize);  // all-zero bits are +0 in every float dtype
      } else if (td == od) {
        std::memcpy(dst, tp + local * C * tsize, C * tsize);
      } else {
        to_f32(tp + local * C * tsize, td, row.data(), C);
        from_f32(row.data(), dst, od, C);
      }
    }
  }
}

void CpuBackend::embedding_backward(const Tensor& ids, const Tensor& dout, int64_t vocab_start, Tensor& dtable) {
  const char* op = "embedding_backward";
  require_ids(ids, op);
  ops::check_table(kChecks, dtable, op, "dtable");
  const int64_t N = ids.numel(), rows = dtable.dim(0), C = dtable.dim(1);
  require_numel(dout, N * C, op, "dout", shape_str({N, C}));
  require_float(dout, op, "dout");
  F32Output tf(dtable, true, op, "dtable");
  const int32_t* idp = ids.i32();
  float* gp = tf.get();
  const int nt = threads_for(N * C, 1 << 14);
#pragma omp parallel num_threads(nt)
  {
    int64_t c0, c1;
    chunk_range(C, omp_get_thread_num(), omp_get_num_threads(), c0, c1);
    Windows w;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t local = static_cast<int64_t>(idp[n]) - vocab_start;
      if (local < 0 || local >= rows) continue;
      float* g = gp + local * C + c0;
      const float* d = w.in(0, dout, n * C + c0, c1 - c0);  // this thread's columns of the row
#pragma omp simd
      for (int64_t c = 0; c < c1 - c0; ++c) g[c] += d[c];
    }
  }
  tf.commit();
}

void CpuBackend::add_positions(const Tensor& pos_table, int64_t T, Tensor& out) {
  const char* op = "add_positions";
  const auto [B, C] = ops::check_positions(kChecks, pos_table, T, out, op, "pos_table", "out");
#pragma omp parallel if (B * T * C > (1 << 15))
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < B * T; ++r) {
      const float* p = w.in(0, pos_table, (r % T) * C, C);
      float* row = w.out(1, out, r * C, C, true);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) row[c] += p[c];
      w.store(1, out, r * C, C);
    }
  }
}

void CpuBackend::add_positions_backward(const Tensor& dout, int64_t T, Tensor& dpos) {
  const char* op = "add_positions_backward";
  const auto [B, C] = ops::check_positions(kChecks, dpos, T, dout, op, "dpos", "dout");
  F32Output pf(dpos, true, op, "dpos");
  float* p = pf.get();
  // Each position row is owned by one thread, which sums the B sequences in order.
#pragma omp parallel if (B * T * C > (1 << 15))
  {
    Windows w;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      float* prow = p + t * C;
      for (int64_t b = 0; b < B; ++b) {
        const float* drow = w.in(0, dout, (b * T + t) * C, C);
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) prow[c] += drow[c];
      }
    }
  }
  pf.commit();
}

}  // namespace gpt
