// The planner's time model: the predicted step time of one layout on one hardware description, analytic
// and per device, with the overlaps of LayoutSpec::overlaps (parallel/plan/overlap.h).
//  - compute: every GEMM (forward, input gradient and weight gradient products of qkv, proj, fc1, fc2 and
//    the LM head, each at its own shape for the model's variant: qkv (H + 2G) D / tp wide for H heads and
//    G query groups of width D, fc1 2 ffn / tp wide for SwiGLU's gate and up, the untied output layer the
//    same product as the tied head) as a roofline, max(flops / (peak x GEMM efficiency at that shape),
//    bytes / achieved bandwidth); the attention core at attention_efficiency; the norms, the activation
//    (GELU, or SwiGLU reading both halves), the rotary encoding, residual adds and the cross-entropy passes
//    as memory traffic (Megatron's unfused cross entropy with LayoutSpec::unfused_cross_entropy);
//    recomputation adds its forward again;
//  - tensor parallel: per layer 2 all-reduces of the residual stream in forward and 2 in backward (under
//    sequence parallelism each an all-gather plus a reduce-scatter), 2 more for a full-recompute forward,
//    as ring collectives over the node's links;
//  - pipeline: m * S_max + (sum_r S_r - S_max) / v for the per-microbatch stage times S_r (Megatron's
//    (m + (p - 1) / v) S for equal stages), with each stage's receives;
//  - context parallel: each layer's ring attention hops (keys and values forward, with the dK/dV partial
//    sums backward) beside the block attention of each ring step, the rank's tokens seq_length / cp;
//  - data parallel: the gradient all-reduce (or reduce-scatter + parameter all-gather with the distributed
//    optimizer) as a hierarchical ring, the tied-embedding all-reduce (none with an untied output layer),
//    and the optimizer's memory traffic.
// The overlap rule: a transfer that runs beside compute costs max(0, transfer - compute it runs under),
// so each overlap hides at most the compute it runs under:
//  - tp: each all-gather and reduce-scatter of a layer runs under the GEMM that Transformer Engine pairs it
//    with (forward: all-gather with the qkv and fc1 products, reduce-scatter with proj and fc2; backward:
//    the all-gather of the output gradient with the proj and fc2 input-gradient products, the
//    reduce-scatter of the input gradient with the qkv and fc1 weight-gradient products);
//  - grad-reduce and param-gather, as Megatron-Core's buckets and schedules run them: the first pipeline
//    rank's first chunk reduces bucket by bucket beside its last backward and gathers beside its first
//    forward, all but the word embedding's bucket, which nothing runs beside; every other chunk is one
//    transfer beside the passes that follow its last backward (or precede its first forward) on the stage;
//  - p2p: each receive runs under the compute of the chunk pass beside it (forward for an activation,
//    backward for a gradient).
// Not modelled: compute slowed by communication kernels sharing the device, the first and last pieces of a
// pipelined transfer that nothing runs beside, per-kernel launch overheads.
#pragma once
#include <string>
#include <vector>

#include "parallel/plan/hardware.h"
#include "parallel/plan/memory_model.h"

namespace gpt {

// Where the time of one step goes, for one layout (the slowest pipeline stage). The exposed parts add up
// to step_s; the hidden parts ran beside compute.
struct TimeEstimate {
  double compute_s = 0;       // GEMMs, attention, memory-bound kernels of all microbatches
  double tp_comm_s = 0;       // exposed tensor-parallel collectives of all microbatches
  double pp_comm_s = 0;       // exposed pipeline receives of all microbatches
  double bubble_s = 0;        // pipeline fill and drain
  double dp_comm_s = 0;       // exposed gradient reduction and parameter gather over data parallel, tied embedding
  double cp_comm_s = 0;       // exposed context-parallel ring hops of all microbatches
  double optimizer_s = 0;     // AdamW, clipping, zeroing the gradients
  double tp_comm_hidden_s = 0;
  double pp_comm_hidden_s = 0;
  double dp_comm_hidden_s = 0;
  double cp_comm_hidden_s = 0;
  double step_s = 0;
  double bubble_fraction = 0;  // idle / busy of the pipeline
  double flops_per_step = 0;   // Megatron's count, recomputation included
  double gemm_flops_per_step = 0;  // of the GEMMs the model charges, over all devices (recomputation included)
  double tflops_per_device = 0;
};

// One line of a step's cost breakdown (plan --explain): a section ("compute", "tensor parallel", ...), a
// label, seconds per step on the slowest stage, and a note (shape, efficiency, what hides it).
struct CostLine {
  std::string section;
  std::string label;
  double seconds = 0;
  std::string note;
};

// `details`, when given, receives the full breakdown, always the same lines in the same order.
TimeEstimate estimate_time(const ModelDescription& model, const LayoutSpec& layout, const HardwareSpec& hw,
                           std::vector<CostLine>* details = nullptr);
// The pipeline part of a step: m microbatches through stages taking stage_seconds[r] per microbatch
// (all of a stage's chunks), v chunks per stage: m * max + (sum - max) / v.
double pipeline_step_seconds(int64_t microbatches, int vpp, const std::vector<double>& stage_seconds);
// FLOPs of one step as Megatron's formula counts them (recomputed forwards included), summed from the
// variant's GEMM shapes: per layer and token 2 h ((H + 2G) D + H D + fc1 width) + 2 ffn h forward, the
// attention core 4 s H D, the logits 2 h V; equal to app/flops.h's closed form without recomputation.
double megatron_flops_per_step(const ModelDescription& model, const LayoutSpec& layout);
// The same without recomputation: the model FLOPs of Megatron-LM's num_floating_point_operations
// (megatron/training/training.py), which its MFU and per-GPU throughput figures use.
double model_flops_per_step(const ModelDescription& model, const LayoutSpec& layout);

}  // namespace gpt
