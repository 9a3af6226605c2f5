// The end of a training iteration for FP8 (model/fp8_scaling.h): every rank's pending amaxes of its
// chunks' FP8 operands, in registration order, are max-reduced over the ranks that hold the same layers
// (the tensor-parallel group and the gradient group of data x context ranks: Megatron's amax reduction
// group), and each scale is
// then recomputed from its history. All of those ranks end with the same scales, so a layout's FP8
// numerics do not depend on how its tensors are split. Nothing happens without precision.fp8.
#pragma once
#include <vector>

#include "model/gpt_model.h"
#include "parallel/grid/process_grid.h"

namespace gpt {

void sync_fp8_amaxes_and_update_scales(ParallelState& ps, const std::vector<ModelChunk*>& chunks);

}  // namespace gpt
