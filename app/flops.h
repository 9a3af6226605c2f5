// Model FLOPs per iteration for MFU: Megatron-LM's num_floating_point_operations (megatron/training/
// training.py, the form with num_query_groups and gated_linear_multiplier). Every GEMM counts three times
// (forward, input gradient, weight gradient) at 2 FLOPs per multiply-add; recomputation is not counted:
//   12 B s l h^2 [ (1 + G/H + s/h) (H d / h) + g f / h + V / (2 l h) ]
// B global batch, s sequence, l layers, h hidden, H heads, G query groups (key/value heads), d = h / H the
// head width (so H d / h = 1), f the MLP width, g = 3/2 for SwiGLU (three h x f matrices to GELU's two)
// else 1, V the padded vocabulary. Per layer: q|k|v and the output projection (1 + G/H), the attention
// core's two products over all s keys (s/h), the MLP (g f/h); once: the logits (an untied output layer
// costs what the tied head does). Norms, biases, rotary encoding and element-wise work are not counted.
// For the GPT-2/GPT-3 layout (G = H, GELU, f = 4h) this is Narayanan et al. 2021, eq. 3:
// 72 B s l h^2 (1 + s/6h + V/12lh). Newer Megatron-LM halves the attention core for the causal mask;
// this keeps eq. 3's count, the one parallel/plan/time_model.h and the planner's published checks use.
#pragma once
#include <cstdint>

#include "model/model_description.h"

namespace gpt {

inline double model_flops_per_iteration(const ModelDescription& m, int64_t global_batch, int64_t padded_vocab) {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq_length);
  const double l = static_cast<double>(m.num_layers), h = static_cast<double>(m.hidden);
  const double H = static_cast<double>(m.heads), G = static_cast<double>(m.query_groups());
  const double f = static_cast<double>(m.ffn), V = static_cast<double>(padded_vocab);
  const double query_to_hidden = H * static_cast<double>(m.head_dim()) / h;
  const double gated_linear_multiplier = m.swiglu ? 1.5 : 1.0;
  return 12.0 * B * s * l * h * h *
         ((1.0 + G / H + s / h) * query_to_hidden + gated_linear_multiplier * f / h + V / (2.0 * l * h));
}

}  // namespace gpt
