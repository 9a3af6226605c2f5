// Built-in hardware descriptions and their validation (see hardware.h). The numbers and their sources are
// repeated, with comments, in configs/hardware/*.yaml.
#include "parallel/plan/hardware.h"

#include <stdexcept>

namespace gpt {

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// A100 SXM4, fp16 torch.mm (cuBLAS), published with "The Case for Co-Designing Model Architectures with
// Hardware" (Anthony et al. 2024): EleutherAI/cookbook sizing/results/gemm_data/mm/{m_sweep,ksweep_high,
// ksweep_low}/a100.out, sizing/results/transformer_data/h_sweep.out (hidden 8192, tensor 4) and
// benchmarks/sizing/sample_results/transformer.out; each figure is the slowest of its timed repetitions.
// Over the 312 TFLOP/s peak; m rows, n columns, k contracted.
GemmEfficiencyTable a100_gemms() {
  return GemmEfficiencyTable({
      {512, 512, 4096, 0.132},    {1024, 1024, 4096, 0.267},  {2048, 2048, 4096, 0.619},
      {4096, 4096, 4096, 0.766},  {8192, 8192, 4096, 0.806},  {2304, 1536, 4096, 0.697},
      {2304, 2048, 4096, 0.674},  {2304, 3072, 4096, 0.753},  {2304, 4096, 4096, 0.717},
      {2304, 6144, 4096, 0.742},  {27648, 128, 4096, 0.442},  {8192, 4096, 4096, 0.753},
      {8192, 12288, 4096, 0.774}, {8192, 16384, 4096, 0.773}, {8192, 4096, 16384, 0.810},
      {8192, 51200, 4096, 0.819}, {8192, 8192, 2048, 0.694},  {8192, 6144, 8192, 0.732},
      {8192, 8192, 8192, 0.814},
  });
}

// H100 SXM5 (sm_90), bf16 products as XLA's GPU compiler runs them, median of 5 timed runs: OpenXLA's
// published matmul performance table, xla/service/gpu/model/matmul_interpolator_data.h (entries with
// batch 1), over the 989 TFLOP/s peak. The H200 has the same SMs and clocks.
GemmEfficiencyTable h100_gemms() {
  return GemmEfficiencyTable({
      {1024, 1024, 1024, 0.239}, {1024, 1024, 2048, 0.354}, {1024, 1024, 4096, 0.475},
      {1024, 2048, 1024, 0.378}, {1024, 2048, 2048, 0.530}, {1024, 2048, 4096, 0.661},
      {1024, 4096, 1024, 0.496}, {1024, 4096, 2048, 0.641}, {1024, 4096, 4096, 0.747},
      {2048, 1024, 1024, 0.378}, {2048, 1024, 2048, 0.529}, {2048, 1024, 4096, 0.660},
      {2048, 2048, 1024, 0.499}, {2048, 2048, 2048, 0.639}, {2048, 2048, 4096, 0.746},
      {2048, 4096, 1024, 0.601}, {2048, 4096, 2048, 0.723}, {2048, 4096, 4096, 0.762},
      {4096, 1024, 1024, 0.493}, {4096, 1024, 2048, 0.639}, {4096, 1024, 4096, 0.747},
      {4096, 2048, 1024, 0.600}, {4096, 2048, 2048, 0.724}, {4096, 2048, 4096, 0.767},
      {4096, 4096, 1024, 0.685}, {4096, 4096, 2048, 0.747}, {4096, 4096, 4096, 0.792},
  });
}

std::vector<HardwareSpec> make_builtins() {
  // Data-sheet peaks (dense, no sparsity) and links; NCCL bus bandwidth ~75% of NVLink, ~80% of
  // InfiniBand; memory-bound kernels ~80% of HBM bandwidth.
  HardwareSpec a100;
  a100.name = "a100-80g";
  a100.description = "NVIDIA A100 SXM4 80 GB, 8 per node (NVSwitch), one 200 Gb/s HDR InfiniBand link per GPU";
  a100.peak_tflops_16bit = 312;
  a100.peak_tflops_fp32 = 19.5;
  a100.gemm_efficiency = a100_gemms();
  a100.sm_count = 108;
  a100.memory_gib = 80;
  a100.memory_reserved_gib = 2;
  a100.memory_bandwidth_gbs = 2039;
  a100.devices_per_node = 8;
  a100.intra_node_bandwidth_gbs = 300;
  a100.inter_node_bandwidth_gbs = 25;

  HardwareSpec h100 = a100;
  h100.name = "h100-80g";
  h100.description = "NVIDIA H100 SXM5 80 GB, 8 per node (NVSwitch), one 400 Gb/s NDR InfiniBand link per GPU";
  h100.peak_tflops_16bit = 989;
  h100.peak_tflops_fp32 = 67;
  h100.gemm_efficiency = h100_gemms();
  // This codebase's GPT-3 1.3B step on one H200 (docs/gpu.md: 58,520 tokens/s, micro-batch 8 x 1024, two
  // microbatches, no communication) against the time model's prediction with the isolated figures (70,929):
  // 0.79 of the GEMM table and attention rates reproduces it (PlannerHardware.InStepFractionReproducesTheH200Step).
  // The H100 SXM5 has the same GH100 compute and 700 W limit.
  h100.in_step_compute_fraction = 0.79;
  h100.sm_count = 132;
  h100.memory_gib = 79.6;
  h100.memory_bandwidth_gbs = 3350;
  h100.intra_node_bandwidth_gbs = 450;
  h100.inter_node_bandwidth_gbs = 50;

  HardwareSpec h200 = h100;
  h200.name = "h200";
  h200.description = "NVIDIA H200 SXM 141 GB, 8 per node (NVSwitch), one 400 Gb/s NDR InfiniBand link per GPU";
  h200.memory_gib = 140.4;
  h200.memory_bandwidth_gbs = 4800;
  return {a100, h100, h200};
}

const std::vector<HardwareSpec>& builtins() {
  static const std::vector<HardwareSpec> list = make_builtins();
  return list;
}

}  // namespace

double HardwareSpec::usable_memory_bytes() const { return (memory_gib - memory_reserved_gib) * GiB; }

void HardwareSpec::validate() const {
  auto need = [&](bool ok, const char* field, const std::string& what) {
    if (!ok) throw std::invalid_argument("hardware '" + name + "': " + field + " " + what);
  };
  need(peak_tflops_16bit > 0, "peak_tflops_16bit", "must be > 0");
  need(peak_tflops_fp32 > 0, "peak_tflops_fp32", "must be > 0");
  try {
    gemm_efficiency.validate();
  } catch (const std::invalid_argument& e) {
    need(false, "gemm_efficiency", e.what());
  }
  // Counted against the dense 4 b s^2 h FLOPs: a causal kernel that skips the masked half can reach 2.
  need(attention_efficiency >= 0 && attention_efficiency <= 2, "attention_efficiency", "must lie in [0, 2]");
  need(in_step_compute_fraction > 0 && in_step_compute_fraction <= 1, "in_step_compute_fraction", "must lie in (0, 1]");
  need(sm_count == 0 || sm_count > 16, "sm_count", "must be 0 (unknown) or more than the 16 a communication kernel takes");
  need(memory_gib > 0, "memory_gib", "must be > 0");
  need(memory_reserved_gib >= 0 && memory_reserved_gib < memory_gib, "memory_reserved_gib", "must lie in [0, memory_gib)");
  need(memory_bandwidth_gbs > 0, "memory_bandwidth_gbs", "must be > 0");
  need(memory_efficiency > 0 && memory_efficiency <= 1, "memory_efficiency", "must lie in (0, 1]");
  need(loss_bandwidth_gbs >= 0, "loss_bandwidth_gbs", "must be >= 0 (0: the memory bandwidth)");
  need(optimizer_bandwidth_gbs >= 0, "optimizer_bandwidth_gbs", "must be >= 0 (0: the memory bandwidth)");
  need(devices_per_node >= 1, "devices_per_node", "must be >= 1");
  need(intra_node_bandwidth_gbs > 0, "intra_node_bandwidth_gbs", "must be > 0");
  need(inter_node_bandwidth_gbs > 0, "inter_node_bandwidth_gbs", "must be > 0");
  need(intra_node_efficiency > 0 && intra_node_efficiency <= 1, "intra_node_efficiency", "must lie in (0, 1]");
  need(inter_node_efficiency > 0 && inter_node_efficiency <= 1, "inter_node_efficiency", "must lie in (0, 1]");
  need(intra_node_latency_us >= 0, "intra_node_latency_us", "must be >= 0");
  need(inter_node_latency_us >= 0, "inter_node_latency_us", "must be >= 0");
}

const HardwareSpec* builtin_hardware(const std::string& name) {
  for (const HardwareSpec& h : builtins())
    if (h.name == name) return &h;
  return nullptr;
}

std::vector<std::string> builtin_hardware_names() {
  std::vector<std::string> names;
  for (const HardwareSpec& h : builtins()) names.push_back(h.name);
  return names;
}

}  // namespace gpt
