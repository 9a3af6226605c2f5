// The paired forward/backward communication ops of tensor parallelism (Megatron's mappings), named for
// where they sit in the model rather than for the collective they call. Activations outside the
// tensor-parallel region (layernorm, residual) are either replicated on every tp rank, or, with sequence
// parallelism, split into tp contiguous row blocks of the [B*T, C] activation.
//  - enter_tp_region: the input of a column-parallel linear. Forward: identity (all-gather of the row
//    blocks under sequence parallelism). Backward: all-reduce of the gradient (reduce-scatter under SP).
//  - exit_tp_region: the output of a row-parallel linear (or the vocab-parallel embedding). Forward:
//    all-reduce of the partial sums (reduce-scatter under SP). Backward: identity (all-gather under SP).
// With a tensor-parallel group of one every op is the identity.
#pragma once
#include "model/communicator.h"
#include "model/ops/backend.h"

namespace gpt {

struct LayerContext {
  Backend& backend;
  Communicator& tp;
  bool sequence_parallel = false;
  // The context-parallel group (model/context_chunks.h); null or a group of one: each rank holds
  // whole sequences. Otherwise the rows are this rank's two chunks of every sequence, chunk-major.
  Communicator* cp = nullptr;
  bool context_parallel() const { return cp && cp->size() > 1; }
  // parallel.tp_comm_overlap: under sequence parallelism the region's all-gathers and reduce-scatters run
  // in row blocks pipelined with the GEMMs beside them (model/tp_overlap.h).
  bool tp_comm_overlap = false;
};

Tensor enter_tp_region(LayerContext& ctx, const Tensor& x);
Tensor enter_tp_region_backward(LayerContext& ctx, Tensor& grad_full);
Tensor exit_tp_region(LayerContext& ctx, Tensor& partial);
Tensor exit_tp_region_backward(LayerContext& ctx, const Tensor& grad);
// Rows of a [rows_full, C] activation this rank holds outside the tp region.
int64_t rows_outside_tp_region(const LayerContext& ctx, int64_t rows_full);

}  // namespace gpt
