// Causal scaled-dot-product attention on cuDNN's fused flash-attention engines, through cuDNN 9's graph
// (backend) API directly: the operation graphs cudnn-frontend builds for its SDPA nodes (matmul,
// pointwise, reduction and reshape operations that the runtime fuses into one kernel), with RAII
// descriptors and execution plans cached per shape. Grouped-query attention (fewer key/value heads than
// query heads) is described as cudnn-frontend describes it: K and V with G heads, which the products
// broadcast over each group's query heads, and in backward dK and dV formed per query head and summed
// over each group by a reduction. Q, K and V are read by strides from the packed qkv
// rows, the output and the gradients are written by strides into their rows, and the statistics are the
// fused-attention contract's log-sum-exp [B, H, T] (model/ops/backend.h). bf16 and fp16 only, head dim a
// multiple of 8 (at most 128, or 256 on Hopper), Ampere or newer. CudaBackend's attention ops use it when
// model.attention_backend allows and fall back to the unfused path when cuDNN rejects a graph.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

#include "model/tensor.h"

namespace gpt::cuda {

// cuDNN cannot run this attention here (head dim, dtype, architecture, library version, or a graph it
// rejects); the unfused path can.
class CudnnUnsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// H query heads sharing G key/value heads (G divides H; G == H is multi-head attention).
struct SdpaShape {
  int64_t B = 0, T = 0, H = 0, G = 0, D = 0;
  DType dtype = DType::BF16;
  // Context parallelism's blocks (Backend::attention_block_*): q_ld > 0 reads the queries from rows of
  // q_ld elements and the keys and values from rows of kv_ld (keys at column kv_ld - 2G*D, values G*D
  // after them), T queries against T keys, and writes the gradients dense ([B*T, H*D] and [B*T, 2G*D],
  // keys then values); causal false attends every key. 0: the packed qkv rows, causal.
  int64_t q_ld = 0, kv_ld = 0;
  bool causal = true;
  bool block() const { return q_ld > 0; }
};

class CudnnAttention {
 public:
  // A cuDNN handle on `stream`; throws CudnnUnsupported when cuDNN cannot be initialised.
  explicit CudnnAttention(cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Why cuDNN's fused attention cannot take this shape on a device of compute capability `sm` (e.g. 90),
  // or "" when it can be tried. Builds nothing.
  static std::string precheck(const SdpaShape& s, int sm, bool backward);

  // Device workspace bytes for the direction (builds and caches the plan; CudnnUnsupported if rejected).
  int64_t workspace_bytes(const SdpaShape& s, bool backward);

  // The contract's forward and backward; `workspace` holds workspace_bytes(s, ...) bytes.
  void forward(const SdpaShape& s, const void* qkv, void* out, float* lse, void* workspace);
  void backward(const SdpaShape& s, const void* qkv, const void* out, const void* dout, const float* lse, void* dqkv,
                void* workspace);
  // A block (s.block()): out [B*T, H*D] and the gradients dq [B*T, H*D], dkv [B*T, 2G*D], all in s.dtype.
  void block_forward(const SdpaShape& s, const void* q, const void* kv, void* out, float* lse, void* workspace);
  void block_backward(const SdpaShape& s, const void* q, const void* kv, const void* out, const void* dout,
                      const float* lse, void* dq, void* dkv, void* workspace);

  struct Plan;

 private:
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, int64_t, int64_t, bool>;
  void run_forward(const SdpaShape& s, const void* q, const void* k, const void* v, void* out, float* lse,
                   void* workspace);
  void run_backward(const SdpaShape& s, const void* q, const void* k, const void* v, const void* out,
                    const void* dout, const float* lse, void* dq, void* dk, void* dv, void* workspace);
  Plan& plan(const SdpaShape& s, bool backward);
  void* handle_ = nullptr;  // cudnnHandle_t
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<Key, std::string> rejected_;  // shapes cuDNN refused, and why: never built again
};

}  // namespace gpt::cuda
