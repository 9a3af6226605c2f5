// Runs one step's pipeline schedule on this rank: for every action of the schedule table it receives the
// input (activation from the previous virtual stage, or gradient from the next), runs the chunk's forward
// or backward, and posts the result to the neighbour with a non-blocking send. Because sends never block
// and the table's dependencies are acyclic (checked by the schedule tests' simulation), the executor
// cannot deadlock. A sent buffer is freed as soon as a received message proves the peer has it
// (parallel/pipeline/send_release.h), so the live send buffers stay bounded by the warm-up count instead of growing
// with the number of microbatches. With one stage and one chunk it is the plain forward/backward loop
// over microbatches. The executor knows which backward pass is each chunk's last of the step, and hands
// that pass's completed gradients to the caller as they complete (the data-parallel overlap starts its
// bucket reductions from there: parallel/data_parallel/grad_buckets.h).
#pragma once
#include <functional>
#include <vector>

#include "data/batch_loader.h"
#include "model/gpt_model.h"
#include "parallel/grid/process_grid.h"

namespace gpt {

// Told, during a chunk's last backward pass of a step, that the gradients of `params` of chunks[chunk]
// are complete.
using ChunkGradsDone = std::function<void(int chunk, const std::vector<Parameter*>& params)>;

// Forward + backward of all of this rank's microbatches of the step starting at `consumed` samples. On the
// last stage each microbatch's mean loss is added to loss_sum (F64 [1] on the device), which is read
// later, so no microbatch waits for the device. With grads_done, each chunk's last backward pass reports
// its parameters as their gradients complete (ModelChunk::backward).
void run_pipeline_step(ParallelState& ps, LayerContext& ctx, const std::vector<ModelChunk*>& chunks,
                       const BatchLoader& loader, int64_t consumed, float grad_scale, Tensor& loss_sum,
                       const ChunkGradsDone* grads_done = nullptr);
// Forward only (evaluation). Returns the sum of the per-microbatch mean losses computed on this rank
// (non-zero on the last stage).
double run_pipeline_eval(ParallelState& ps, LayerContext& ctx, const std::vector<ModelChunk*>& chunks,
                         const BatchLoader& loader, int64_t consumed);

}  // namespace gpt
