// The layout planner: enumerates the ways to run a model on N devices (tensor, pipeline, virtual
// pipeline and data parallel degrees, micro-batch size, activation recomputation, distributed
// optimizer), predicts each one's memory per device (parallel/memory_model.h) and step time, and ranks
// them. The time model is analytic and per device:
//  - compute: every GEMM as a roofline, max(flops / (peak x matmul_efficiency), bytes / bandwidth); the
//    attention core at attention_efficiency; layernorm, GELU, residual adds, softmax probabilities and
//    the cross-entropy passes as memory traffic at the achieved memory bandwidth; backward = 2x forward,
//    recomputation adds the forward (full) or the attention core (selective) again;
//  - tensor parallel: the all-reduces (or all-gather + reduce-scatter under sequence parallelism) of the
//    residual stream, 2 per layer in forward, 2 in backward, 2 more for a full-recompute forward, as ring
//    collectives over the node's links (TP groups are consecutive ranks, so they stay inside a node);
//  - pipeline: the 1F1B step of m microbatches takes m * S_max + (sum_r S_r - S_max) / v, S_r being stage
//    r's time for one microbatch (compute, TP and its point-to-point receives; with Megatron's
//    scatter/gather, 1/tp of each activation per link plus an all-gather inside the node), which is
//    Megatron's (m + (p - 1) / v) S for equal stages; the bubble is reported as idle / busy = (p - 1) / (v m);
//  - data parallel: the gradient all-reduce in the gradient dtype (fp32 here; reduce-scatter + all-gather
//    with the distributed optimizer) after the pipeline, not overlapped (as the trainer does it), as a
//    hierarchical ring: an intra-node part among the group's members on one node, an inter-node part over
//    their network links; plus the tied-embedding all-reduce between the first and last stage and the
//    optimizer step's memory traffic.
// Ranks are placed in Megatron's order (rank = tp + TP * (dp + DP * pp)), devices_per_node per node.
// TFLOP/s per device counts the FLOPs of Megatron's formula (Narayanan et al. 2021, eq. 3) including the
// recomputed forward passes: 72 (none) or 96 (full) B s l h^2 (1 + s/6h + ...) for ffn = 4h.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "parallel/memory_model.h"

namespace gpt {

// One device type and the machine it sits in. Bandwidths are per device and direction, as the data
// sheet gives them; the efficiencies say which fraction is achieved in practice.
struct HardwareSpec {
  std::string name;
  std::string description;
  double peak_tflops_16bit = 0;   // dense bf16 / fp16 matmul peak
  double peak_tflops_fp32 = 0;    // dense fp32 matmul peak
  double matmul_efficiency = 0.7; // fraction of peak large GEMMs sustain
  double attention_efficiency = 0; // the attention core's rate over peak, counting Megatron's dense 4 b s^2 h
                                   // FLOPs (a causal kernel skipping the masked half can exceed 1); 0 = matmul
  double memory_gib = 0;          // device memory
  double memory_reserved_gib = 0; // not available to tensors (runtime, communication buffers, fragmentation)
  double memory_bandwidth_gbs = 0;
  double memory_efficiency = 0.8;
  int devices_per_node = 1;
  double intra_node_bandwidth_gbs = 0;  // device to device inside a node (NVLink; shared memory on a CPU)
  double intra_node_efficiency = 0.75;
  double intra_node_latency_us = 5;
  double inter_node_bandwidth_gbs = 0;  // each device's own network link
  double inter_node_efficiency = 0.8;
  double inter_node_latency_us = 10;

  double usable_memory_bytes() const;
  // Throws std::invalid_argument naming the field when a value is missing or impossible.
  void validate() const;
};

// Built-in descriptions: a100-80g, h100-80g, h200 (DGX-style nodes of 8). nullptr for other names.
const HardwareSpec* builtin_hardware(const std::string& name);
std::vector<std::string> builtin_hardware_names();

// Where the time of one step goes, for one layout (the slowest pipeline stage).
struct TimeEstimate {
  double compute_s = 0;     // GEMMs, attention, memory-bound kernels of all microbatches
  double tp_comm_s = 0;     // tensor-parallel collectives of all microbatches
  double pp_comm_s = 0;     // pipeline receives of all microbatches
  double bubble_s = 0;      // pipeline fill and drain
  double dp_comm_s = 0;     // gradient reduction over data parallel (and the tied embedding)
  double optimizer_s = 0;   // AdamW, clipping, zeroing the gradients
  double step_s = 0;
  double bubble_fraction = 0;  // idle / busy of the pipeline
  double flops_per_step = 0;   // Megatron's count, recomputation included
  double tflops_per_device = 0;
};

TimeEstimate estimate_time(const ModelDims& model, const LayoutSpec& layout, const HardwareSpec& hw);
// The pipeline part of a step: m microbatches through stages taking stage_seconds[r] per microbatch
// (all of a stage's chunks), v chunks per stage: m * max + (sum - max) / v.
double pipeline_step_seconds(int64_t microbatches, int vpp, const std::vector<double>& stage_seconds);
// FLOPs of one step as Megatron's formula counts them (recomputed forwards included).
double megatron_flops_per_step(const ModelDims& model, const LayoutSpec& layout);

struct PlanOptions {
  int devices = 1;
  int devices_per_node = 0;                     // 0 = the hardware's
  std::optional<Recompute> recompute;           // fixed, or every mode
  std::optional<bool> distributed_optimizer;    // fixed, or both
  bool sequence_parallel = false;               // used whenever tp > 1
  DType dtype = DType::BF16;
  int64_t max_micro_batch = 16;
  int max_virtual_pipeline = 8;
  SendBuffers send_buffers = SendBuffers::ReleasedWhenKnownReceived;  // the executor whose memory is modelled
  // Megatron-LM's behaviour instead of this codebase's (LayoutSpec::grad_dtype, p2p_scatter_gather):
  bool grads_in_compute_dtype = false;  // gradient buffers and their dp reduction in the compute dtype
  bool p2p_scatter_gather = false;      // pipeline sends split over the tp ranks, all-gathered on arrival
  bool materialized_attention = false;  // the fp32 softmax stored between forward and backward
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

// Enumerates and ranks every layout of `model` with this global batch on options.devices devices.
Plan make_plan(const ModelDims& model, int64_t global_batch, const HardwareSpec& hw, const PlanOptions& options);
// Evaluates one layout (validate_layout must pass) on hardware with this many devices per node.
PlanEntry evaluate_layout(const ModelDims& model, const LayoutSpec& layout, const HardwareSpec& hw,
                          SendBuffers sends = SendBuffers::ReleasedWhenKnownReceived);

}  // namespace gpt
