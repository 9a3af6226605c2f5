// Token and learned-position embeddings on the GPU. The token table may be one vocab-parallel shard: ids
// outside [vocab_start, vocab_start + rows) give zero rows and receive no gradient. The token gradient is
// deterministic: the ids are sorted with their positions (CUB's stable radix sort), and each distinct id's
// rows of the output gradient are added onto its table row in position order, the CPU backend's order, by
// one block. (Atomic adds would make a batch with repeated ids differ from run to run in the last bits,
// and with them the bit-for-bit equivalence of the parallel layouts.) The position gradient sums the B
// sequences per position in order.
// Negative ids are reported through the device error report (raised at the next synchronisation).
#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_device_error.cuh"
#include "model/ops/cuda/cuda_half.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

namespace gpt {

using namespace cuda;

namespace {

constexpr int kThreads = 256;

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// out[n, c] = table[ids[n] - vocab_start, c], or 0 outside the shard. out is [N, C].
__global__ void embedding_forward_kernel(const int32_t* ids, const void* table, DType td, int64_t rows,
                                         int64_t vocab_start, void* out, DType od, int64_t N, int64_t C,
                                         DeviceErrorReport* report) {
  GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    const int32_t id = ids[n];
    if (id < 0 && c == 0) report_device_error(report, DeviceError::NegativeTokenId, CudaOp::EmbeddingForward, n, id, 0);
    const int64_t local = static_cast<int64_t>(id) - vocab_start;
    const float v = (id >= 0 && local >= 0 && local < rows) ? load_as_f32(table, td, local * C + c) : 0.f;
    store_from_f32(out, od, i, v);
  }
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  GRID_STRIDE(i, n) out[i] = static_cast<int32_t>(i);
}

// dtable[id - vocab_start, c] += dout[n, c] over the positions n holding id, in increasing n, for each id
// inside the shard; dtable fp32. sorted_ids/order are the ids sorted stably with their positions: the
// block of a run's first entry does the whole run, the other blocks return.
__global__ void embedding_backward_sorted_kernel(const int32_t* sorted_ids, const int32_t* order, const void* dout,
                                                 DType dd, int64_t N, int64_t rows, int64_t vocab_start,
                                                 float* dtable, int64_t C, DeviceErrorReport* report) {
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int32_t id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;
    if (id < 0) {
      if (threadIdx.x == 0)
        report_device_error(report, DeviceError::NegativeTokenId, CudaOp::EmbeddingBackward, order[i], id, 0);
      continue;
    }
    const int64_t local = static_cast<int64_t>(id) - vocab_start;
    if (local < 0 || local >= rows) continue;
    int64_t end = i + 1;
    while (end < N && sorted_ids[end] == id) ++end;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = dtable[local * C + c];
      for (int64_t j = i; j < end; ++j) acc += load_as_f32(dout, dd, static_cast<int64_t>(order[j]) * C + c);
      dtable[local * C + c] = acc;
    }
  }
}

// out[b * T + t, c] += pos[t, c]; out is [B * T, C].
__global__ void add_positions_kernel(const void* pos, DType pd, int64_t T, void* out, DType od, int64_t rows,
                                     int64_t C) {
  GRID_STRIDE(i, rows * C) {
    const int64_t r = i / C, c = i % C;
    store_from_f32(out, od, i, load_as_f32(out, od, i) + load_as_f32(pos, pd, (r % T) * C + c));
  }
}

// dpos[t, c] += sum over b in order of dout[b * T + t, c]; one thread per (t, c).
__global__ void add_positions_backward_kernel(const void* dout, DType dd, int64_t B, int64_t T, void* dpos, DType pd,
                                              int64_t C) {
  GRID_STRIDE(i, T * C) {
    const int64_t t = i / C, c = i % C;
    float s = 0.f;
    for (int64_t b = 0; b < B; ++b) s += load_as_f32(dout, dd, (b * T + t) * C + c);
    store_from_f32(dpos, pd, i, load_as_f32(dpos, pd, i) + s);
  }
}

}  // namespace

void CudaBackend::embedding_forward(const Tensor& ids, const Tensor& table, int64_t vocab_start, Tensor& out) {
  const char* op = "embedding_forward";
  require_dtype(ids, DType::I32, op, "ids");
  ops::check_table(kChecks, table, op, "table");
  require_float(out, op, "out");
  const int64_t N = ids.numel(), rows = table.dim(0), C = table.dim(1);
  require_numel(out, N * C, op, "out", shape_str({N, C}));
  if (N * C == 0) return;
  embedding_forward_kernel<<<grid_for(N * C, kThreads), kThreads, 0, stream_>>>(
      ids.i32(), table.raw(), table.dtype(), rows, vocab_start, out.raw(), out.dtype(), N, C, error_device_);
  check_launch(op);
}

void CudaBackend::embedding_backward(const Tensor& ids, const Tensor& dout, int64_t vocab_start, Tensor& dtable) {
  const char* op = "embedding_backward";
  require_dtype(ids, DType::I32, op, "ids");
  ops::check_table(kChecks, dtable, op, "dtable");
  require_float(dout, op, "dout");
  const int64_t N = ids.numel(), rows = dtable.dim(0), C = dtable.dim(1);
  require_numel(dout, N * C, op, "dout", shape_str({N, C}));
  if (N * C == 0) return;
  // The sums run in fp32; a 16-bit gradient table (not used by the model) goes through an fp32 copy.
  Tensor acc = as_dtype(dtable, DType::F32);
  require(N <= INT32_MAX, op, "more than 2^31 - 1 token ids in one call");
  const int n = static_cast<int>(N);
  Tensor positions = empty({N}, DType::I32), order = empty({N}, DType::I32), sorted = empty({N}, DType::I32);
  iota_kernel<<<grid_for(N, kThreads), kThreads, 0, stream_>>>(positions.i32(), N);
  check_launch(op);
  size_t temp_bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids.i32(), sorted.i32(), positions.i32(),
                                             order.i32(), n, 0, 32, stream_),
             op, "cub::DeviceRadixSort::SortPairs (size)");
  Tensor temp = empty({static_cast<int64_t>(temp_bytes / 4 + 1)});
  check_cuda(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, ids.i32(), sorted.i32(), positions.i32(),
                                             order.i32(), n, 0, 32, stream_),
             op, "cub::DeviceRadixSort::SortPairs");
  sync_check(op, "cub::DeviceRadixSort::SortPairs (waited for under GPT_CUDA_SYNC_CHECKS)", "CUB sort");
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(N, 1 << 20));
  embedding_backward_sorted_kernel<<<blocks, kThreads, 0, stream_>>>(sorted.i32(), order.i32(), dout.raw(),
                                                                     dout.dtype(), N, rows, vocab_start, acc.f32(), C,
                                                                     error_device_);
  check_launch(op);
  if (acc.raw() != dtable.raw()) copy(acc, dtable);
}

void CudaBackend::add_positions(const Tensor& pos_table, int64_t T, Tensor& out) {
  const char* op = "add_positions";
  const auto [B, C] = ops::check_positions(kChecks, pos_table, T, out, op, "pos_table", "out");
  if (B == 0) return;
  add_positions_kernel<<<grid_for(B * T * C, kThreads), kThreads, 0, stream_>>>(pos_table.raw(), pos_table.dtype(), T,
                                                                                out.raw(), out.dtype(), B * T, C);
  check_launch(op);
}

void CudaBackend::add_positions_backward(const Tensor& dout, int64_t T, Tensor& dpos) {
  const char* op = "add_positions_backward";
  const auto [B, C] = ops::check_positions(kChecks, dpos, T, dout, op, "dpos", "dout");
  add_positions_backward_kernel<<<grid_for(T * C, kThreads), kThreads, 0, stream_>>>(dout.raw(), dout.dtype(), B, T,
                                                                                     dpos.raw(), dpos.dtype(), C);
  check_launch(op);
}

}  // namespace gpt
