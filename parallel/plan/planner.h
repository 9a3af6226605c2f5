// The layout planner: enumerates the ways to run a model on N devices (tensor, pipeline, virtual
// pipeline and data parallel degrees, micro-batch size, activation recomputation, distributed
// optimizer), predicts each one's memory per device (parallel/plan/memory_model.h) and step time
// (parallel/plan/time_model.h, on a hardware description from parallel/plan/hardware.h, with the communication
// overlaps of parallel/plan/overlap.h that apply to the layout), and ranks them.
// Ranks are placed in Megatron's order (rank = tp + TP * (cp + CP * (dp + DP * pp))), devices_per_node per
// node; context parallelism (PlanOptions::max_context) divides each rank's activations and attention work by
// cp and adds the ring's hops (parallel/plan/time_model.h).
// TFLOP/s per device counts the FLOPs of Megatron's formula (Narayanan et al. 2021, eq. 3; for every
// variant app/flops.h's form with query groups and SwiGLU's three matrices) including the recomputed
// forward passes: 72 (none) or 96 (full) B s l h^2 (1 + s/6h + ...) for the GPT layout.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "parallel/plan/hardware.h"
#include "parallel/plan/memory_model.h"
#include "parallel/plan/overlap.h"
#include "parallel/plan/time_model.h"

namespace gpt {

struct PlanOptions {
  int devices = 1;
  int devices_per_node = 0;                     // 0 = the hardware's
  std::optional<Recompute> recompute;           // fixed, or every mode
  std::optional<bool> distributed_optimizer;    // fixed, or both
  bool sequence_parallel = false;               // used whenever tp > 1
  DType dtype = DType::BF16;
  int64_t max_micro_batch = 16;
  int max_virtual_pipeline = 8;
  // Context-parallel degrees tried: 1..max_context (each dividing the devices left by tensor parallelism
  // and seq_length / 2). 1 searches none: context parallelism pays for long sequences only.
  int max_context = 1;
  SendBuffers send_buffers = SendBuffers::ReleasedWhenKnownReceived;  // the executor whose memory is modelled
  // Megatron-LM's behaviour instead of this codebase's (LayoutSpec::grad_dtype, p2p_scatter_gather):
  bool grads_in_compute_dtype = false;  // gradient buffers and their dp reduction in the compute dtype
  bool p2p_scatter_gather = false;      // pipeline sends split over the tp ranks, all-gathered on arrival
  bool materialized_attention = false;  // the 2021 attention: scores, softmax and dropout through memory
  bool unfused_cross_entropy = false;   // Megatron's cross entropy: six passes over fp32 logits
  bool regather_sp_inputs = false;      // Megatron's sequence parallelism: inputs gathered again in backward
  // Communication assumed to run beside compute; each layout gets the members that apply to it
  // (applicable_overlaps).
  Overlaps overlaps;
  // Asynchronous checkpoint saves: each layout's host snapshot is estimated (LayoutSpec).
  bool checkpoint_snapshot = false;
  bool snapshot_optimizer_state = true;
};

struct PlanEntry {
  LayoutSpec layout;
  MemoryEstimate memory;  // the device that holds the most
  TimeEstimate time;
  bool fits = false;
};

// A (tensor, pipeline[, data]) choice that cannot run at all, with the rule it breaks.
struct RejectedLayout {
  int tp = 0, pp = 0, dp = 0;  // dp = 0: rejected before data parallelism was chosen
  std::string reason;
};

struct Plan {
  HardwareSpec hardware;
  PlanOptions options;
  std::vector<PlanEntry> layouts;  // fitting ones by predicted step time, then the rest by memory
  std::vector<RejectedLayout> rejected;
  const PlanEntry* best() const { return !layouts.empty() && layouts.front().fits ? &layouts.front() : nullptr; }
  // Position (1-based) of the first entry that `match` accepts among fitting layouts; 0 when none.
  template <typename F>
  int rank_of(F&& match) const {
    for (size_t i = 0; i < layouts.size() && layouts[i].fits; ++i)
      if (match(layouts[i].layout)) return static_cast<int>(i) + 1;
    return 0;
  }
};

// The (tp, pp, dp, cp) choice's fastest fitting variant, or its smallest when none fits (layouts are
// sorted: fitting by step time, then by memory); nullptr when the plan holds none of its variants.
const PlanEntry* find_choice(const Plan& plan, int tp, int pp, int dp, int cp = 1);
// Rank (1-based) of the (tp, pp, dp, cp) choice among the plan's distinct fitting choices, each counted
// once by its fastest variant; 0 when none of its variants fits. `choices`, when given, receives how many
// distinct fitting choices there are.
int choice_rank(const Plan& plan, int tp, int pp, int dp, int cp = 1, int* choices = nullptr);

// Enumerates and ranks every layout of `model` with this global batch on options.devices devices.
Plan make_plan(const ModelDescription& model, int64_t global_batch, const HardwareSpec& hw, const PlanOptions& options);
// Evaluates one layout (validate_layout must pass) on hardware with this many devices per node.
PlanEntry evaluate_layout(const ModelDescription& model, const LayoutSpec& layout, const HardwareSpec& hw,
                          SendBuffers sends = SendBuffers::ReleasedWhenKnownReceived);

}  // namespace gpt
