// Gradient reductions inside one model replica, after the backward pass of a step:
//  - tied embedding: the head's gradient of the word embedding is summed with the embedding's (over the
//    embedding group when they live on different pipeline stages, locally otherwise);
//  - sequence parallelism: replicated tensors whose gradients came from row blocks (layernorm) are
//    summed over the tp group.
// The data-parallel reduction, norm and clipping follow in parallel/data_parallel/data_parallel.h.
#pragma once
#include <vector>

#include "model/gpt_model.h"
#include "parallel/grid/process_grid.h"

namespace gpt {

void reduce_tied_embedding(ParallelState& ps, Backend& backend, const std::vector<ModelChunk*>& chunks);
void reduce_sequence_parallel_grads(ParallelState& ps, const std::vector<ModelChunk*>& chunks);
// The same for some parameters only (those of one block, as the overlapped backward pass completes them).
void reduce_sequence_parallel_grads(ParallelState& ps, const std::vector<Parameter*>& params);

}  // namespace gpt
