// Warp- and block-level reductions for the CUDA kernels. Each is a fixed tree (butterfly shuffles, then
// one value per warp through shared memory), so for a given launch shape the result never depends on
// timing: the backend's reductions are reproducible run to run. Block reductions assume blockDim.x is a
// multiple of 32 and at most 1024, and must be reached by every thread of the block.
#pragma once
#include <cuda_runtime.h>

namespace gpt::cuda {

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block; every thread gets the total.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = lane < warps ? partial[lane] : T(0);
  return warp_sum(total);
}

// Max over the block; every thread gets it.
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = lane < warps ? partial[lane] : -__int_as_float(0x7f800000);
  return warp_max(m);
}

}  // namespace gpt::cuda
