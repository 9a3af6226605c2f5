// Model FLOPs per iteration, Megatron's formula (Narayanan et al. 2021, eq. 3) without activation
// recomputation: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) for global batch B, sequence s, layers l,
// hidden h, vocabulary V (it assumes ffn = 4h; with full recomputation the paper's 96 replaces 72 for
// hardware FLOPs, but model FLOPs do not count recomputation).
#pragma once
#include <cstdint>

namespace gpt {

inline double model_flops_per_iteration(int64_t global_batch, int64_t seq, int64_t layers, int64_t hidden,
                                        int64_t vocab) {
  double B = global_batch, s = seq, l = layers, h = hidden, V = vocab;
  return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
}

}  // namespace gpt
