// A flat buffer as the optimizer sees it: consecutive runs of elements ("segments"), each the part of one
// parameter that lies in the range being updated, with the weight-decay rate AdamW applies to it and the
// slot of the per-parameter sum of squares behind the gradient norm. The flat ops (Backend::adamw_step_flat,
// Backend::sum_squares_segments) take one table for a whole buffer, so a step costs one call per buffer
// however many parameters it holds; elements outside every segment (padding) are left alone.
#pragma once
#include <cstdint>
#include <vector>

namespace gpt::ops {

struct FlatSegment {
  int64_t begin = 0, end = 0;  // element range [begin, end) of the flat tensors the op is given
  float weight_decay = 0.f;    // AdamW's decoupled decay rate for these elements
  int32_t norm_slot = -1;      // which sum of squares the elements add to; -1: none
};

}  // namespace gpt::ops
