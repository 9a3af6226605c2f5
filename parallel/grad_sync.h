// Gradient reduction after the backward pass of a step, in the order a step needs it:
//  1. tied embedding: the head's gradient of the word embedding is summed with the embedding's (over the
//     embedding group when they live on different pipeline stages, locally otherwise);
//  2. data parallel: every chunk's flat gradient buffer is summed over the dp group in buckets, front to
//     back (the buffer is laid out in reverse layer order, so the first buckets are the last layers);
//  3. the global gradient norm: each parameter counted once (tensor-parallel replicas and the tied copy
//     skipped), summed in a canonical, layout-independent parameter order; then clipping.
#pragma once
#include <vector>

#include "model/gpt_model.h"
#include "parallel/process_grid.h"

namespace gpt {

void reduce_tied_embedding(ParallelState& ps, Backend& backend, const std::vector<ModelChunk*>& chunks);
// Under sequence parallelism: sums the gradients of replicated tensors computed from row blocks
// (layernorm) over the tp group.
void reduce_sequence_parallel_grads(ParallelState& ps, const std::vector<ModelChunk*>& chunks);
// Sums gradients over dp in buckets of at most bucket_bytes.
void all_reduce_data_parallel(ParallelState& ps, const std::vector<ModelChunk*>& chunks, int64_t bucket_bytes);
// sqrt of the sum of squares of every global gradient element. `sharded_over_dp`: each dp rank holds a
// disjoint part of the gradients (distributed optimizer), so the dp group contributes too.
double global_grad_norm(ParallelState& ps, Backend& backend, const std::vector<ModelChunk*>& chunks,
                        int64_t num_global_params, bool sharded_over_dp = false);
// Scales every gradient by clip / (norm + 1e-6) when that is below one (Megatron's rule).
void clip_gradients(Backend& backend, const std::vector<ModelChunk*>& chunks, double norm, double clip);

}  // namespace gpt
