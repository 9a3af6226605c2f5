// The paired forward/backward communication ops of tensor parallelism (Megatron's mappings), named for
// what they mean in the math rather than for the collective they call:
//  - copy_to_tp: the input of a column-parallel linear; identity forward, all-reduce of the gradient.
//  - reduce_from_tp: the output of a row-parallel linear; all-reduce forward, identity backward.
// With a tensor-parallel group of one every op is the identity.
#pragma once
#include "model/ops/backend.h"
#include "parallel/communicator.h"

namespace gpt {

struct LayerContext {
  Backend& backend;
  Communicator& tp;
};

inline void reduce_from_tp_forward(LayerContext& ctx, Tensor& partial) {
  if (ctx.tp.size() > 1) ctx.tp.all_reduce(partial);
}
inline void copy_to_tp_backward(LayerContext& ctx, Tensor& grad_input) {
  if (ctx.tp.size() > 1) ctx.tp.all_reduce(grad_input);
}

}  // namespace gpt
