// The planner's hardware descriptions (parallel/plan/hardware.h): the in-step compute fraction against
// the measured H200 steps it comes from, the built-ins against configs/hardware/*.yaml and their YAML round
// trip, bad files named by key, and the CPU probe's description loadable and plannable.
#include <gtest/gtest.h>

#include <string>

#include "app/plan.h"
#include "parallel/plan/planner.h"

using namespace gpt;

// The H100 and H200 descriptions' in_step_compute_fraction comes from one measured step: this codebase's
// GPT-3 1.3B (24 layers, hidden 2048, 16 heads, sequence 1024, vocabulary 50257) on one H200 in bf16,
// micro-batch 8, two microbatches per step, no communication, ran at 58,520 tokens/s (docs/gpu.md). The
// time model reproduces it within 1%, and predicts 21% more with the isolated-kernel figures.
TEST(PlannerHardware, InStepFractionReproducesTheH200Step) {
  const HardwareSpec& h200 = *builtin_hardware("h200");
  const ModelDescription m{24, 2048, 16, 4 * 2048, 1024, 50257, 128};
  LayoutSpec l;
  l.micro_batch = 8, l.global_batch = 16;
  l.dtype = DType::BF16;
  const double tokens = 16 * 1024;
  const double measured = 58520;
  EXPECT_NEAR(tokens / estimate_time(m, l, h200).step_s / measured, 1.0, 0.01);
  HardwareSpec isolated = h200;
  isolated.in_step_compute_fraction = 1;
  EXPECT_NEAR(tokens / estimate_time(m, l, isolated).step_s / measured, 1.21, 0.01);
  // The same build's GPT-2 124M step (12 layers, hidden 768, micro-batch 16 x 1024, two microbatches),
  // measured at 420,785 tokens/s, is a check the fraction was not fitted to: predicted 8.7% fast (its
  // kernels are a ninth the size; launch gaps and element-wise kernels weigh more, docs/planner.md).
  const ModelDescription small{12, 768, 12, 4 * 768, 1024, 50257, 128};
  LayoutSpec s = l;
  s.micro_batch = 16, s.global_batch = 32;
  EXPECT_NEAR(32 * 1024 / estimate_time(small, s, h200).step_s / 420785, 1.087, 0.03);
  EXPECT_DOUBLE_EQ(builtin_hardware("h100-80g")->in_step_compute_fraction, h200.in_step_compute_fraction);
  EXPECT_DOUBLE_EQ(builtin_hardware("a100-80g")->in_step_compute_fraction, 1.0);  // no step measured there
}

TEST(PlannerHardware, FilesMatchTheBuiltIns) {
  for (const std::string& name : builtin_hardware_names()) {
    HardwareSpec file = load_hardware(std::string(GPT_SOURCE_DIR) + "/configs/hardware/" + name + ".yaml");
    const HardwareSpec& built = *builtin_hardware(name);
    EXPECT_EQ(file.name, built.name);
    EXPECT_EQ(file.description, built.description);
    EXPECT_EQ(file.devices_per_node, built.devices_per_node);
    HardwareSpec round = hardware_from_yaml(hardware_to_yaml(built), "round trip");
    for (double HardwareSpec::*f :
         {&HardwareSpec::peak_tflops_16bit, &HardwareSpec::peak_tflops_fp32,
          &HardwareSpec::attention_efficiency, &HardwareSpec::memory_gib, &HardwareSpec::memory_reserved_gib,
          &HardwareSpec::memory_bandwidth_gbs, &HardwareSpec::memory_efficiency, &HardwareSpec::intra_node_bandwidth_gbs,
          &HardwareSpec::intra_node_efficiency, &HardwareSpec::intra_node_latency_us,
          &HardwareSpec::inter_node_bandwidth_gbs, &HardwareSpec::inter_node_efficiency,
          &HardwareSpec::inter_node_latency_us, &HardwareSpec::loss_bandwidth_gbs,
          &HardwareSpec::optimizer_bandwidth_gbs, &HardwareSpec::in_step_compute_fraction,
          &HardwareSpec::sm_count}) {
      EXPECT_DOUBLE_EQ(file.*f, built.*f) << name;
      EXPECT_DOUBLE_EQ(round.*f, built.*f) << name;
    }
    for (const HardwareSpec* h : {&file, &round}) {
      ASSERT_EQ(h->gemm_efficiency.entries().size(), built.gemm_efficiency.entries().size()) << name;
      for (size_t i = 0; i < built.gemm_efficiency.entries().size(); ++i) {
        const GemmShapeEfficiency &a = h->gemm_efficiency.entries()[i], &b = built.gemm_efficiency.entries()[i];
        EXPECT_EQ(a.m, b.m) << name << " entry " << i;
        EXPECT_EQ(a.n, b.n) << name << " entry " << i;
        EXPECT_EQ(a.k, b.k) << name << " entry " << i;
        EXPECT_DOUBLE_EQ(a.efficiency, b.efficiency) << name << " entry " << i;
      }
    }
  }
}

TEST(PlannerHardware, BadFilesNameTheKey) {
  const std::string good = hardware_to_yaml(*builtin_hardware("a100-80g"));
  auto message = [](const std::string& yaml) {
    try {
      hardware_from_yaml(yaml, "test.yaml");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(good + "peak_tflop: 3\n").find("unknown key 'peak_tflop'"), std::string::npos);
  EXPECT_NE(message("peak_tflops_16bit: 10\n").find("missing key"), std::string::npos);
  std::string bad = good;
  bad.replace(bad.find("memory_gib: 80"), 14, "memory_gib: lots");
  EXPECT_NE(message(bad).find("key 'memory_gib' must be a number"), std::string::npos);
  bad = good;
  bad.replace(bad.find("attention_efficiency: 0"), 23, "attention_efficiency: 3");
  EXPECT_NE(message(bad).find("attention_efficiency must lie in [0, 2]"), std::string::npos) << message(bad);
  EXPECT_NE(message(good + "loss_bandwidth_gbs: -1\n").find("loss_bandwidth_gbs must be >= 0"), std::string::npos);
  EXPECT_NE(message(good + "optimizer_bandwidth_gbs: fast\n").find("key 'optimizer_bandwidth_gbs' must be a number"),
            std::string::npos);
  EXPECT_NE(message(good + "in_step_compute_fraction: 1.5\n").find("in_step_compute_fraction must lie in (0, 1]"),
            std::string::npos);
  EXPECT_NE(message(good + "sm_count: 8\n").find("sm_count must be 0 (unknown) or more than the 16"), std::string::npos);
  EXPECT_THROW(load_hardware("no-such-gpu"), std::runtime_error);
}

TEST(PlannerHardware, CpuProbeWritesALoadableDescription) {
  HardwareSpec example = load_hardware(std::string(GPT_SOURCE_DIR) + "/configs/hardware/cpu-probe-example.yaml");
  EXPECT_EQ(example.name, "cpu-probe");
  HardwareSpec hw = probe_cpu(1, 2);
  EXPECT_GT(hw.peak_tflops_fp32, 1e-4);  // at least 0.1 GFLOP/s on any machine that runs the tests
  EXPECT_GT(hw.peak_tflops_16bit, 1e-4);
  EXPECT_GT(hw.memory_bandwidth_gbs, 0.1);
  EXPECT_GT(hw.loss_bandwidth_gbs, 0.01);  // measured, never the GPUs' default of 0
  EXPECT_GT(hw.optimizer_bandwidth_gbs, 0.01);
  EXPECT_EQ(hw.devices_per_node, 2);
  // The GEMM table: a grid of 27 measured shapes and 3 with a vocabulary-sized axis, the fastest at 1.
  EXPECT_EQ(hw.gemm_efficiency.entries().size(), 30u);
  EXPECT_DOUBLE_EQ(hw.gemm_efficiency.best(), 1.0);
  EXPECT_NO_THROW(hw.gemm_efficiency.validate());
  HardwareSpec back = hardware_from_yaml(hardware_to_yaml(hw), "probe");
  EXPECT_NEAR(back.peak_tflops_fp32, hw.peak_tflops_fp32, 1e-5 * hw.peak_tflops_fp32);
  EXPECT_NEAR(back.loss_bandwidth_gbs, hw.loss_bandwidth_gbs, 1e-5 * hw.loss_bandwidth_gbs);
  EXPECT_NEAR(back.optimizer_bandwidth_gbs, hw.optimizer_bandwidth_gbs, 1e-5 * hw.optimizer_bandwidth_gbs);
  // The planner accepts it: config M on the two "devices" of this machine.
  PlanOptions o;
  o.devices = 2;
  o.dtype = DType::F32;
  Plan plan = make_plan(ModelDescription{6, 384, 6, 1536, 256, 50304, 128}, 8, back, o);
  ASSERT_NE(plan.best(), nullptr);
  EXPECT_GT(plan.best()->time.step_s, 0);
}

