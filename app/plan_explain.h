// `gpt-train plan --explain TP,PP,DP`: the full cost breakdown of one (tensor, pipeline, data) choice
// next to the planner's best layout, line by line (every GEMM with its shape and efficiency, the attention
// core, memory-bound kernels, recomputation, each parallelism's communication with the part its overlap
// hides, the bubble, the optimizer, memory per device, and which assumed overlaps apply), so a user can
// see why one layout is preferred. The choice is shown in its best variant (micro-batch, virtual pipeline,
// recomputation, distributed optimizer) among those that fit, or its smallest if none fits.
#pragma once
#include <string>

#include "parallel/plan/planner.h"

namespace gpt {

struct LayoutChoice {
  int tp = 0, pp = 0, dp = 0, cp = 1;
};

// "8,1,48" -> {8, 1, 48}; "1,1,2,4" -> {1, 1, 2, cp 4}. Throws std::invalid_argument naming --explain on anything else.
LayoutChoice parse_layout_choice(const std::string& text);

// The breakdown as text. Throws std::invalid_argument naming --explain when the choice does not multiply
// to the plan's device count or breaks a rule (with the rule).
std::string explain_layout(const Plan& plan, const ModelDescription& model, const LayoutChoice& choice);

}  // namespace gpt
