// A device type and the machine it sits in, as the planner's time model sees it: dense matmul peaks with
// the GEMM efficiency each product shape achieves (parallel/plan/gemm_efficiency.h), the attention core's rate,
// memory size and bandwidth, and the links inside and between nodes. Bandwidths are per device and
// direction, as data sheets give them; the efficiencies say which fraction is achieved in practice. The
// built-in descriptions (a100-80g, h100-80g, h200) are also in configs/hardware/*.yaml with the sources of
// every number; a test checks that the two agree.
#pragma once
#include <string>
#include <vector>

#include "parallel/plan/gemm_efficiency.h"

namespace gpt {

struct HardwareSpec {
  std::string name;
  std::string description;
  double peak_tflops_16bit = 0;  // dense bf16 / fp16 matmul peak
  double peak_tflops_fp32 = 0;   // dense fp32 matmul peak
  // Achieved fraction of the dtype's peak by product shape (measured in bf16 for the GPUs, in fp32 by the
  // CPU probe; the same fractions are applied to both peaks).
  GemmEfficiencyTable gemm_efficiency;
  double attention_efficiency = 0;  // the attention core's rate over peak, counting Megatron's dense 4 b s^2 h
                                    // FLOPs (a causal kernel skipping the masked half can exceed 1); 0 = the
                                    // GEMM table's best entry
  // The fraction of the GEMM table's and the attention's rates that kernels keep inside a training step,
  // against the isolated, back-to-back kernels the table was measured with (the device holds its power
  // limit for seconds, operands arrive cold after the memory-bound kernels, communication kernels share
  // it). 1 = the isolated figures. Measured from a whole training step on the device (configs/hardware/).
  double in_step_compute_fraction = 1;
  // Streaming multiprocessors per device (0: unknown), for the SMs Transformer Engine's communication
  // kernels take from a GEMM (Overlaps::tp_userbuffers).
  double sm_count = 0;
  double memory_gib = 0;            // device memory
  bool host_memory_is_device_memory = false;  // a CPU: host buffers (checkpoint snapshots) take from it too
  double memory_reserved_gib = 0;   // not available to tensors (runtime, communication buffers, fragmentation)
  double memory_bandwidth_gbs = 0;
  double memory_efficiency = 0.8;
  // Achieved rates of two passes that are not plain streaming on a CPU, counted in the bytes the time model
  // charges them (parallel/plan/time_model.cpp): the cross-entropy over the logits (its exponentials, two per
  // element, cost more than the traffic on one core) and AdamW with the gradient norm and clipping (a
  // square root and a division per element). 0 = memory_bandwidth_gbs x memory_efficiency, which is what
  // a GPU achieves for both; the CPU probe measures them.
  double loss_bandwidth_gbs = 0;
  double optimizer_bandwidth_gbs = 0;
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

}  // namespace gpt
