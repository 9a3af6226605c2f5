// Reductions of the CUDA backend, all deterministic: the launch shape depends only on the problem size
// and every partial result is combined in a fixed order, never with atomics.
//  - column sums of a [rows, cols] matrix (bias gradients): chunks of 64 rows are summed per column into
//    fp32 partials, then the partials are added chunk by chunk into the destination;
//  - sum of squares in fp64 (gradient norm): one fp64 partial per block, then one block adds the partials.
#include <algorithm>

#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_half.cuh"
#include "model/ops/cuda/cuda_launch.h"
#include "model/ops/cuda/cuda_reduce.cuh"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kColTile = 32;   // columns per block (one warp wide)
constexpr int kRowLanes = 8;   // warps per block, each walking every 8th row of the chunk

// partials[k, c] = sum_{r in chunk k} x[r, c]. Grid (ceil(cols / 32), chunks), block (32, 8).
__global__ void column_partial_kernel(const void* x, DType xd, int64_t rows, int64_t cols, float* partials) {
  __shared__ float acc[kRowLanes][kColTile + 1];
  const int64_t c = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * kColumnSumRowsPerChunk;
  const int64_t r1 = min(rows, r0 + kColumnSumRowsPerChunk);
  float s = 0.f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) s += load_as_f32(x, xd, r * cols + c);
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.f;
    for (int y = 0; y < kRowLanes; ++y) total += acc[y][threadIdx.x];
    partials[int64_t(blockIdx.y) * cols + c] = total;
  }
}

// dst[c] += sum_k partials[k, c], k in order. One thread per column.
__global__ void add_partials_kernel(const float* partials, int64_t chunks, int64_t cols, void* dst, DType dd) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < cols; c += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int64_t k = 0; k < chunks; ++k) s += partials[k * cols + c];
    store_from_f32(dst, dd, c, load_as_f32(dst, dd, c) + s);
  }
}

// partial[block] = sum of x[i]^2 over the block's grid-stride share, in fp64.
__global__ void sum_squares_partial_kernel(const void* x, DType xd, int64_t n, double* partial) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = load_as_f32(x, xd, i);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] = sum of partial[0..count), one block.
__global__ void sum_partials_kernel(const double* partial, int count, double* out) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = s;
}

}  // namespace

namespace cuda {

int64_t column_sum_chunks(int64_t rows, const char* op) {
  const int64_t chunks = rows <= 0 ? 1 : (rows + kColumnSumRowsPerChunk - 1) / kColumnSumRowsPerChunk;
  require(chunks <= 65535, op, "too many rows (" + std::to_string(rows) + ")");
  return chunks;
}

void column_partial_sums(const void* x, DType x_dtype, int64_t rows, int64_t cols, float* partials,
                         cudaStream_t stream) {
  if (cols <= 0) return;
  const int64_t chunks = column_sum_chunks(rows, "column sums");
  dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  column_partial_kernel<<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(x, x_dtype, rows, cols, partials);
  check_launch("column sums");
}

void add_partial_sums(const float* partials, int64_t chunks, int64_t cols, void* dst, DType dst_dtype,
                      cudaStream_t stream) {
  if (cols <= 0) return;
  add_partials_kernel<<<grid_for(cols, 256), 256, 0, stream>>>(partials, chunks, cols, dst, dst_dtype);
  check_launch("column sums");
}

}  // namespace cuda

double CudaBackend::sum_squares(const Tensor& t) {
  require_float(t, "sum_squares", "t");
  const int64_t n = t.numel();
  if (n == 0) return 0.0;
  constexpr int kThreads = 256;
  // The block count depends on n only, so the summation order (and the result) is fixed.
  const int blocks = static_cast<int>(std::min<int64_t>(1024, (n + kThreads * 4 - 1) / (kThreads * 4)));
  Tensor scratch = empty({2 * (blocks + 1)}, DType::F32);  // room for blocks + 1 doubles
  double* p = scratch.data<double>();
  sum_squares_partial_kernel<<<blocks, kThreads, 0, stream_>>>(t.raw(), t.dtype(), n, p);
  check_launch("sum_squares");
  sum_partials_kernel<<<1, 1024, 0, stream_>>>(p, blocks, p + blocks);
  check_launch("sum_squares");
  double result = 0.0;
  wait_for_stream("sum_squares");
  check_cuda(cudaMemcpyAsync(&result, p + blocks, sizeof(double), cudaMemcpyDeviceToHost, stream_), "sum_squares",
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream_), "sum_squares", "cudaStreamSynchronize");
  return result;
}

}  // namespace gpt
