// The CPU backend's attention as it was before it became fused, kept as a test-only reference: causal
// attention over packed fp32 qkv [B*T, (H + 2G)*D] (H query heads sharing G key/value heads, the layout of
// model/ops/backend.h) that materialises the softmax in probs
// [B, H, T, T] (fp32) and keeps it for the backward pass. Used to check the fused kernels
// (tests/attention_test.cpp) and as the baseline of bench/attention_bench.
#pragma once
#include <cstdint>

#include "model/tensor.h"

namespace gpt::reference {

// out [B*T, H*D] fp32; probs [B, H, T, T] fp32 (upper triangle zero).
void materialized_attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                                    Tensor& out, Tensor& probs);
// dqkv [B*T, (H + 2G)*D] fp32 (overwritten; each group's dk and dv summed over its query heads).
void materialized_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t B,
                                     int64_t T, int64_t H, int64_t G, int64_t D, Tensor& dqkv);

}  // namespace gpt::reference
