// GPT_HOST_DEVICE marks the small functions that a CPU loop and a CUDA kernel share (the per-element math
// of a CPU/CUDA op pair), so that both backends compute the same expression in the same order.
#pragma once

#ifdef __CUDACC__
#define GPT_HOST_DEVICE __host__ __device__
#else
#define GPT_HOST_DEVICE
#endif
