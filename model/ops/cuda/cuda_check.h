// Host-side checks shared by the CUDA backend's files: CUDA and cuBLAS status codes turned into
// std::runtime_error naming the op and the library's own message, and argument checks that throw
// "CudaBackend::<op>: <message>" like the CPU backend's. Tensors handed to the backend must live on the
// GPU; a host tensor passed by mistake is reported rather than dereferenced.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "model/ops/cuda/cuda_op_profile.h"
#include "model/ops/op_checks.h"
#include "model/tensor.h"

namespace gpt::cuda {

inline void check_cuda(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("CudaBackend::") + op + ": " + what + " failed: " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

const char* cublas_status_name(cublasStatus_t s);

inline void check_cublas(cublasStatus_t s, const char* op, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("CudaBackend::") + op + ": " + what + " failed: " + cublas_status_name(s));
}

// GPT_CUDA_SYNC_CHECKS=1: every kernel launch and library call is waited for and checked at once, so an
// asynchronous fault (an illegal address, a failed kernel) is reported by the op that caused it rather than
// by a later synchronisation (as CUDA_LAUNCH_BLOCKING=1 does for launches; this also covers cuBLAS, cuBLASLt
// and cuDNN). Slow: for finding a fault, not for training.
inline bool sync_checks() {
  static const bool on = [] {
    const char* v = std::getenv("GPT_CUDA_SYNC_CHECKS");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// How the sync checks wait (set by the CUDA backend): for the compute stream only, so that a rank never
// waits for its own communication streams, whose peers may be waiting for this rank's next call; and by
// polling, running the communicators' error checks meanwhile, so that a compute stream held up by a failed
// NCCL peer raises that failure instead of waiting for it forever.
inline std::function<cudaError_t()>& sync_check_wait() {
  static auto* wait = new std::function<cudaError_t()>();  // never destroyed, like the device context
  return *wait;
}

// After `op` enqueued work of `kind` (a kernel, a cuBLAS or cuBLASLt product, cuDNN's attention, a memset,
// a copy, CUB's sort; downloads wait for the stream anyway): under GPT_CUDA_PROFILE marks it for the
// per-op profile (cuda_op_profile.h); under GPT_CUDA_SYNC_CHECKS waits for the compute stream and raises
// what that work did.
inline void sync_check(const char* op, const char* what, const char* kind = "kernel") {
  if (OpProfile* p = OpProfile::active()) p->mark(std::string(op) + " (" + kind + ")");
  if (sync_checks()) {
    const std::function<cudaError_t()>& wait = sync_check_wait();
    check_cuda(wait ? wait() : cudaDeviceSynchronize(), op, what);
  }
}

// Checks for an error from the kernel launch just made (bad configuration, missing kernel image), and
// under GPT_CUDA_SYNC_CHECKS for one from the kernel itself.
inline void check_launch(const char* op) {
  check_cuda(cudaGetLastError(), op, "kernel launch");
  sync_check(op, "the kernel (waited for under GPT_CUDA_SYNC_CHECKS)");
}

// The shared argument checks (model/ops/op_checks.h), as the CUDA backend: messages read
// "CudaBackend::<op>: ...", and tensors must live in GPU memory.
inline constexpr ops::OpChecks kChecks{"CudaBackend", Device::CUDA};

inline void require(bool ok, const char* op, const std::string& message) { kChecks.require(ok, op, message); }
inline void require_device(const Tensor& t, const char* op, const char* arg) { kChecks.require_here(t, op, arg); }
inline void require_float(const Tensor& t, const char* op, const char* arg) { kChecks.require_float(t, op, arg); }
inline void require_dtype(const Tensor& t, DType dtype, const char* op, const char* arg) {
  kChecks.require_dtype(t, dtype, op, arg);
}
inline void require_numel(const Tensor& t, int64_t numel, const char* op, const char* arg, const std::string& what) {
  kChecks.require_numel(t, numel, op, arg, what);
}
using ops::describe;
using ops::is_float;

// Grid size for a grid-stride loop over n items with `threads` per block: enough blocks to fill the GPU
// several times over, never more than the items need.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 8) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return static_cast<unsigned>(blocks);
}

// The row kernels (LayerNorm, RMSNorm, the softmax passes of attention) give each row one warp and each
// block kWarpRowsPerBlock rows. warp_row_blocks is their grid size for `rows` rows, checked against CUDA's
// grid limit in 64-bit arithmetic before it is narrowed, and called before anything is launched.
inline constexpr int kWarpRowsPerBlock = 8;
inline unsigned warp_row_blocks(int64_t rows, const char* op) {
  const int64_t blocks = (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
  require(blocks <= 0x7fffffffLL, op, "too many rows (" + std::to_string(rows) + ") for one kernel grid");
  return static_cast<unsigned>(blocks);
}

}  // namespace gpt::cuda
