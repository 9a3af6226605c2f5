// Kernel launchers that more than one file of the CUDA backend needs, declared as plain C++ so host-only
// files can call them. Each enqueues on `stream` and returns at once.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/tensor.h"

namespace gpt::cuda {

// dst[i] = src[i] for i < n, converted between float dtypes (round-to-nearest-even, as half.h), or copied
// bit for bit when the dtypes are equal (I32 too). cuda_memory.cu.
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream);

// dst[c] += sum over chunks k in order of partials[k * cols + c]; dst has dtype dst_dtype. The fixed
// order makes the column sums reproducible. cuda_reduce.cu.
void add_partial_sums(const float* partials, int64_t chunks, int64_t cols, void* dst, DType dst_dtype,
                      cudaStream_t stream);

// Rows per chunk and number of chunks the column-sum kernels cut `rows` into; the chunks are a grid
// dimension, so more than 65535 of them raise "CudaBackend::<op>: too many rows". Call it before launching.
int64_t column_sum_chunks(int64_t rows, const char* op);
constexpr int64_t kColumnSumRowsPerChunk = 64;

// partials[k * cols + c] = sum of x[r, c] over the rows r of chunk k, x a [rows, cols] matrix of any float
// dtype. partials must hold column_sum_chunks(rows) * cols floats. cuda_reduce.cu.
void column_partial_sums(const void* x, DType x_dtype, int64_t rows, int64_t cols, float* partials,
                         cudaStream_t stream);

}  // namespace gpt::cuda
