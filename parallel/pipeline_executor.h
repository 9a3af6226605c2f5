// Runs one step's pipeline schedule on this rank: for every action of the schedule table it receives the
// input (activation from the previous virtual stage, or gradient from the next), runs the chunk's forward
// or backward, and posts the result to the neighbour with a non-blocking send. Because sends never block
// and the table's dependencies are acyclic (checked by the schedule tests' simulation), the executor
// cannot deadlock. A sent buffer is freed as soon as a received message proves the peer has it
// (parallel/send_release.h), so the live send buffers stay bounded by the warm-up count instead of growing
// with the number of microbatches. With one stage and one chunk it is the plain forward/backward loop
// over microbatches.
#pragma once
#include <vector>

#include "data/batch_loader.h"
#include "model/gpt_model.h"
#include "parallel/process_grid.h"

namespace gpt {

// Forward + backward of all of this rank's microbatches of the step starting at `consumed` samples.
// Returns the sum of the per-microbatch mean losses computed on this rank (non-zero on the last stage).
double run_pipeline_step(ParallelState& ps, LayerContext& ctx, const std::vector<ModelChunk*>& chunks,
                         const BatchLoader& loader, int64_t consumed, float grad_scale);
// Forward only (evaluation), same return convention.
double run_pipeline_eval(ParallelState& ps, LayerContext& ctx, const std::vector<ModelChunk*>& chunks,
                         const BatchLoader& loader, int64_t consumed);

}  // namespace gpt
