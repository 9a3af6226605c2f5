// Ring attention: causal self-attention over a sequence split across a context-parallel group
// (model/context_chunks.h). Each rank holds its two chunks' packed qkv rows, chunk-major; the keys and
// values go round the ring (rank r sends to r + 1 and receives from r - 1) with the next step's exchange in
// flight while the current block's attention runs. Each query chunk keeps an fp32 running output and
// log-sum-exp, merged block by block (Backend::attention_merge), rounded once into `att` at the end.
// Backward sends the keys and values round again, accumulates dQ locally, and passes each block's fp32
// dK/dV accumulator on one step behind its keys (as Megatron-Core does), each rank adding its share
// computed into a fresh buffer while the partial sum arrives; after the last step one hop returns every
// block's complete dK/dV to its owner.
#pragma once
#include <cstdint>

#include "model/communicator.h"
#include "model/ops/backend.h"

namespace gpt {

struct RingShape {
  int64_t B = 0;      // sequences
  int64_t chunk = 0;  // positions per chunk (T / (2 * CP)); each rank holds 2 * chunk per sequence
  int64_t H = 0, G = 0, D = 0;
};

// qkv [2*B*chunk, (H + 2G)*D] (rows chunk-major: chunk 0's B sequences, then chunk 1's) -> att
// [2*B*chunk, H*D] in qkv's dtype and lse F32 [2, B, H, chunk].
void ring_attention_forward(Backend& be, Communicator& cp, const Tensor& qkv, const RingShape& s, Tensor& att,
                            Tensor& lse);
// dqkv (qkv's shape, any float dtype) = the gradient of the whole ring's attention for this rank's rows.
void ring_attention_backward(Backend& be, Communicator& cp, const Tensor& datt, const Tensor& qkv, const Tensor& att,
                             const Tensor& lse, const RingShape& s, Tensor& dqkv);

}  // namespace gpt
