// The planner (parallel/plan/planner.h) against itself: the time model reduces to Megatron's bubble
// formula for equal stages and charges what the executor options change; FLOPs follow Megatron's formula
// for the GPT layout and, for Llama-shaped models (grouped-query attention, SwiGLU, untied output layer),
// the closed forms; the enumeration obeys its rules (every listed layout is valid, rejections name the
// rule); more devices per node, faster links or more memory never make a prediction worse; the plan
// command's table, JSON and the trainer's start-up check; context parallelism for long sequences. The
// checks against published runs are in plan_published_test.cpp and plan_h100_test.cpp, the hardware
// descriptions in plan_hardware_test.cpp.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include <fstream>
#include <iostream>
#include <sstream>

#include "app/config_model.h"
#include "app/config.h"
#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/grid/process_grid.h"

#include "app/cli.h"
#include "app/flops.h"
#include "app/plan.h"
#include "parallel/plan/planner.h"
#include "tests/llama_variants.h"

using namespace gpt;

// ---- the time model's parts ----

TEST(PlannerTimeModel, PipelineFormulaMatchesTheScheduleSimulator) {
  // Equal stages: the simulated makespan of the real schedule tables, in units of one chunk pass,
  // is the formula's m * S + (p - 1) S / v with S = v (tf + tb).
  for (int p : {1, 2, 4, 8})
    for (int v : {1, 2, 4})
      for (int m : {4, 8, 16}) {
        if (v > 1 && (p == 1 || m % p)) continue;
        SimResult sim = simulate(p, v, m, SimCost{1, 2});
        ASSERT_TRUE(sim.completed) << sim.error;
        const double S = v * 3.0;
        EXPECT_DOUBLE_EQ(pipeline_step_seconds(m, v, std::vector<double>(p, S)), double(sim.makespan))
            << "p " << p << " v " << v << " m " << m;
      }
  // Unequal stages, p = 2, m = 2 (a light first stage, a heavy last one): by hand, 2 S1 + S0.
  EXPECT_DOUBLE_EQ(pipeline_step_seconds(2, 1, {1.0, 5.0}), 11.0);
}

TEST(PlannerTimeModel, MegatronExecutorOptionsChargeWhatTheyChange) {
  // 16-bit gradient buffers halve the gradient memory and the data-parallel bytes; the optimizer step then
  // needs fp32 copies of them. Scatter/gather moves 1/tp of each activation between nodes.
  ModelDescription m{16, 2048, 16, 8192, 2048, 51200, 128};
  LayoutSpec l;
  l.tp = 4, l.pp = 4, l.dp = 4, l.micro_batch = 1, l.global_batch = 64, l.dtype = DType::F16;
  const HardwareSpec& a100 = *builtin_hardware("a100-80g");
  LayoutSpec megatron = l;
  megatron.grad_dtype = DType::F16;
  const MemoryEstimate m32 = estimate_memory(m, l, 0), m16 = estimate_memory(m, megatron, 0);
  EXPECT_EQ(m16.grads * 2, m32.grads);
  EXPECT_GE(m16.activations, m16.parameters * 4);
  const TimeEstimate t32 = estimate_time(m, l, a100), t16 = estimate_time(m, megatron, a100);
  EXPECT_LT(t16.dp_comm_s, 0.6 * t32.dp_comm_s);
  EXPECT_DOUBLE_EQ(t16.pp_comm_s, t32.pp_comm_s);
  megatron.p2p_scatter_gather = true;
  const TimeEstimate sg = estimate_time(m, megatron, a100);
  EXPECT_LT(sg.pp_comm_s, 0.5 * t16.pp_comm_s);
  EXPECT_DOUBLE_EQ(sg.tp_comm_s, t16.tp_comm_s);
  EXPECT_NE(megatron.str().find("grads=fp16 p2p_scatter_gather"), std::string::npos) << megatron.str();
}

TEST(PlannerTimeModel, FlopsFollowMegatronsFormula) {
  // 72 B s l h^2 (1 + s/6h + V/12lh) without recomputation, 96 (1 + s/6h + V/16lh) with full.
  ModelDescription m{24, 2304, 24, 4 * 2304, 2048, 51200, 128};
  LayoutSpec l;
  l.global_batch = 512;
  const double B = 512, s = 2048, L = 24, h = 2304, V = 51200;
  const double f72 = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h));
  const double f96 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
  EXPECT_NEAR(megatron_flops_per_step(m, l) / f72, 1.0, 1e-12);
  l.recompute = Recompute::Full;
  EXPECT_NEAR(megatron_flops_per_step(m, l) / f96, 1.0, 1e-12);
}

namespace {

// A Llama-2-7B-like shape with 8 key/value groups (Llama-2-70B's ratio), SwiGLU and an untied output layer.
ModelDescription llama_shape() { return with_llama_variants({32, 4096, 32, 11008, 4096, 32000, 128}, 8); }

}  // namespace

TEST(PlannerTimeModel, VariantGemmFlopsEqualTheClosedForm) {
  // Every GEMM the time model charges, over all devices, against 6 B s [l (h (H + 2G) D + h H D + 2 f h
  // + f h) + h V]: q|k|v with 2G key/value heads, SwiGLU's three matrices, the untied output layer.
  const ModelDescription m = llama_shape();
  LayoutSpec l;
  l.tp = 4, l.pp = 2, l.dp = 2, l.micro_batch = 1, l.global_batch = 16, l.dtype = DType::BF16;
  l.sequence_parallel = true;
  const double B = 16, s = 4096, L = 32, h = 4096, H = 32, G = 8, D = 128, f = 11008;
  const double V = static_cast<double>(m.padded_vocab(4));
  const double layer = 2 * h * (H + 2 * G) * D + 2 * h * H * D + 2 * h * 2 * f + 2 * f * h;  // forward, per token
  const HardwareSpec hw = *builtin_hardware("h100-80g");
  EXPECT_NEAR(estimate_time(m, l, hw).gemm_flops_per_step / (B * s * (3 * L * layer + 6 * h * V)), 1.0, 1e-12);
  l.recompute = Recompute::Full;  // the forward once more
  EXPECT_NEAR(estimate_time(m, l, hw).gemm_flops_per_step / (B * s * (4 * L * layer + 6 * h * V)), 1.0, 1e-12);
  // Megatron's count adds the attention core (4 s H D per token and layer forward) to the same GEMMs, and
  // without recomputation it is app/flops.h's model FLOPs.
  l.recompute = Recompute::None;
  const double model = B * s * (3 * L * (layer + 4 * s * H * D) + 6 * h * V);
  EXPECT_NEAR(megatron_flops_per_step(m, l) / model, 1.0, 1e-12);
  EXPECT_NEAR(model_flops_per_iteration(m, 16, m.padded_vocab(4)) / model, 1.0, 1e-12);
  // The GPT layout of the same size: 2 * 4h^2 + 2 * 2hf per token forward.
  ModelDescription gpt{32, 4096, 32, 4 * 4096, 4096, 32000, 128};
  const double gpt_layer = 2 * 4 * h * h + 2 * 2 * h * 4 * h;
  EXPECT_NEAR(estimate_time(gpt, l, hw).gemm_flops_per_step / (B * s * (3 * L * gpt_layer + 6 * h * V)), 1.0, 1e-12);
}

TEST(PlannerTimeModel, UntiedOutputLayerHasNoEmbeddingAllReduce) {
  ModelDescription m = llama_shape();
  LayoutSpec l;
  l.tp = 8, l.pp = 4, l.dp = 2, l.micro_batch = 1, l.global_batch = 32, l.dtype = DType::BF16;
  const HardwareSpec hw = *builtin_hardware("h100-80g");
  auto tied_line = [&](const ModelDescription& model) {
    std::vector<CostLine> lines;
    estimate_time(model, l, hw, &lines);
    for (const CostLine& c : lines)
      if (c.label == "tied embedding all-reduce") return c;
    ADD_FAILURE() << "no tied embedding line";
    return CostLine{};
  };
  EXPECT_EQ(tied_line(m).seconds, 0);
  EXPECT_EQ(tied_line(m).note, "untied output layer");
  m.untie_embeddings = false;
  EXPECT_GT(tied_line(m).seconds, 0);
}

TEST(ModelFlops, GptLayoutIsMegatronsEquation3) {
  // 72 B s l h^2 (1 + s/6h + V/12lh), the formula this function had before the variants.
  struct Shape {
    int64_t layers, hidden, heads, seq, vocab, batch;
  };
  for (const Shape& x : {Shape{6, 384, 6, 256, 50304, 32}, Shape{24, 2304, 24, 2048, 51200, 512},
                         Shape{96, 12288, 96, 2048, 51200, 1536}, Shape{2, 32, 2, 16, 128, 8}}) {
    ModelDescription m{x.layers, x.hidden, x.heads, 4 * x.hidden, x.seq, x.vocab, 128};
    const double B = double(x.batch), s = double(x.seq), l = double(x.layers), h = double(x.hidden),
                 V = double(x.vocab);
    const double eq3 = 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
    EXPECT_NEAR(model_flops_per_iteration(m, x.batch, x.vocab) / eq3, 1.0, 1e-14) << x.hidden;
    // Rotary positions, RMSNorm, untying and biases do not change the count.
    m.position = PositionEmbedding::Rope;
    m.normalization = Normalization::RMSNorm;
    m.untie_embeddings = true;
    m.add_bias_linear = false;
    EXPECT_NEAR(model_flops_per_iteration(m, x.batch, x.vocab) / eq3, 1.0, 1e-14) << x.hidden;
  }
}

TEST(ModelFlops, LlamaShapeByHand) {
  // B 2, s 8, l 2, h 16, 4 heads of 4 in 2 groups, SwiGLU with f 32, V 64. Per token and layer, forward:
  // q|k|v 2*16*(4+2*2)*4 = 1024, proj 2*16*16 = 512, gate|up 2*16*64 = 2048, fc2 2*32*16 = 1024, attention
  // core 4*8*16 = 512: 5120, times 3 (forward and two backward products) = 15360, times 2 layers = 30720;
  // the logits 6*16*64 = 6144: 36864 per token, times B s = 16 tokens = 589824.
  ModelDescription m{2, 16, 4, 32, 8, 64, 64};
  m.swiglu = true;
  m.num_query_groups = 2;
  m.untie_embeddings = true;
  EXPECT_DOUBLE_EQ(model_flops_per_iteration(m, 2, 64), 589824.0);
  m.num_query_groups = 0;  // multi-head: k and v of 4 heads, 2*16*16 = 512 more per token and layer forward
  EXPECT_DOUBLE_EQ(model_flops_per_iteration(m, 2, 64), 589824.0 + 16 * 2 * 3 * 512);
}

TEST(PlannerTimeModel, BetterHardwareNeverPredictsSlower) {
  ModelDescription m{16, 2048, 16, 8192, 2048, 51200, 128};
  LayoutSpec l;
  l.tp = 4, l.pp = 2, l.vpp = 2, l.dp = 4, l.micro_batch = 2, l.global_batch = 256, l.dtype = DType::BF16;
  const HardwareSpec base = *builtin_hardware("h100-80g");
  const double t0 = estimate_time(m, l, base).step_s;
  for (double HardwareSpec::*f : {&HardwareSpec::peak_tflops_16bit, &HardwareSpec::memory_bandwidth_gbs,
                                  &HardwareSpec::intra_node_bandwidth_gbs, &HardwareSpec::inter_node_bandwidth_gbs}) {
    HardwareSpec better = base;
    better.*f *= 2;
    EXPECT_LT(estimate_time(m, l, better).step_s, t0);
  }
  // Components add up to the step.
  TimeEstimate t = estimate_time(m, l, base);
  EXPECT_NEAR(t.compute_s + t.tp_comm_s + t.pp_comm_s + t.bubble_s + t.dp_comm_s + t.optimizer_s, t.step_s, 1e-9 * t.step_s);
  EXPECT_GT(t.tp_comm_s, 0);
  EXPECT_GT(t.pp_comm_s, 0);
  // The cross-entropy and optimizer rates: 0 (a GPU's files) means the memory bandwidth; a measured lower
  // rate charges those passes more, and only them.
  HardwareSpec same = base, slow_loss = base, slow_optimizer = base;
  same.loss_bandwidth_gbs = same.optimizer_bandwidth_gbs = base.memory_bandwidth_gbs * base.memory_efficiency;
  EXPECT_NEAR(estimate_time(m, l, same).step_s, t0, 1e-12 * t0);
  slow_loss.loss_bandwidth_gbs = 0.25 * base.memory_bandwidth_gbs * base.memory_efficiency;
  slow_optimizer.optimizer_bandwidth_gbs = 0.25 * base.memory_bandwidth_gbs * base.memory_efficiency;
  const TimeEstimate tl = estimate_time(m, l, slow_loss), to = estimate_time(m, l, slow_optimizer);
  EXPECT_GT(tl.compute_s, t.compute_s);
  EXPECT_DOUBLE_EQ(tl.optimizer_s, t.optimizer_s);
  EXPECT_NEAR(to.optimizer_s, 4 * t.optimizer_s, 1e-9 * to.optimizer_s);
  EXPECT_DOUBLE_EQ(to.compute_s, t.compute_s);
  EXPECT_GT(t.dp_comm_s, 0);
  EXPECT_NEAR(t.bubble_fraction, (2 - 1.0) / (2 * l.microbatches()), 0.2 * (2 - 1.0) / (2 * l.microbatches()));
}

// ---- the enumeration ----

TEST(PlannerEnumeration, EveryLayoutIsValidAndRejectionsNameTheRule) {
  ModelDescription m{30, 3072, 32, 4 * 3072, 2048, 51200, 128};
  PlanOptions o;
  o.devices = 64;
  Plan plan = make_plan(m, 512, *builtin_hardware("a100-80g"), o);
  ASSERT_FALSE(plan.layouts.empty());
  std::set<std::tuple<int, int, int, int, int64_t, int, bool>> unique;
  for (const PlanEntry& e : plan.layouts) {
    const LayoutSpec& l = e.layout;
    EXPECT_EQ(l.world(), 64);
    EXPECT_EQ(8 % l.tp, 0) << l.str();
    EXPECT_NO_THROW(validate_layout(m, l)) << l.str();
    EXPECT_TRUE(unique.insert({l.tp, l.pp, l.vpp, l.dp, l.micro_batch, int(l.recompute), l.distributed_optimizer}).second);
    EXPECT_EQ(e.fits, e.memory.total() <= plan.hardware.usable_memory_bytes());
  }
  for (size_t i = 1; i < plan.layouts.size(); ++i) {
    const PlanEntry &a = plan.layouts[i - 1], &b = plan.layouts[i];
    EXPECT_TRUE(a.fits >= b.fits);
    if (a.fits && b.fits) {
      EXPECT_LE(a.time.step_s, b.time.step_s);
    }
  }
  bool layers = false, cross_node = false;
  for (const RejectedLayout& r : plan.rejected) {
    layers = layers || r.reason.find("num_layers 30 is not divisible by pipeline 4") != std::string::npos;
    cross_node = cross_node || (r.tp == 16 && r.reason.find("cross nodes") != std::string::npos);
  }
  EXPECT_TRUE(layers);
  EXPECT_TRUE(cross_node);
  // Grouped-query attention: tensor parallelism must split the key/value groups whole.
  ModelDescription gqa = m;
  gqa.num_query_groups = 4;
  PlanOptions eight;
  eight.devices = 8;
  const Plan grouped = make_plan(gqa, 512, *builtin_hardware("a100-80g"), eight);
  bool groups = false;
  for (const RejectedLayout& r : grouped.rejected)
    groups = groups ||
             (r.tp == 8 && r.reason.find("num_query_groups 4 is not divisible by tensor 8") != std::string::npos);
  EXPECT_TRUE(groups);
  for (const PlanEntry& e : grouped.layouts) EXPECT_LE(e.layout.tp, 4);
  // Fixing options narrows the search.
  o.recompute = Recompute::Selective;
  o.distributed_optimizer = true;
  for (const PlanEntry& e : make_plan(m, 512, *builtin_hardware("a100-80g"), o).layouts) {
    EXPECT_EQ(e.layout.recompute, Recompute::Selective);
    EXPECT_EQ(e.layout.distributed_optimizer, e.layout.dp > 1);
  }
}

TEST(PlannerEnumeration, MoreMemoryFitsMore) {
  ModelDescription m{40, 6144, 48, 4 * 6144, 2048, 51200, 128};
  PlanOptions o;
  o.devices = 64;
  int fits80 = 0, fits141 = 0;
  for (const PlanEntry& e : make_plan(m, 512, *builtin_hardware("h100-80g"), o).layouts) fits80 += e.fits;
  for (const PlanEntry& e : make_plan(m, 512, *builtin_hardware("h200"), o).layouts) fits141 += e.fits;
  EXPECT_GT(fits141, fits80);
}

// ---- the command and the trainer's start-up check ----

namespace {

// The plan subcommand as main runs it: 2 for a command line it refuses, else plan_main's status.
std::string run_plan(const std::vector<std::string>& argv, int* rc) {
  std::ostringstream out;
  auto* old = std::cout.rdbuf(out.rdbuf());
  try {
    *rc = parse_command_line(argv).run();
  } catch (const CliError&) {
    *rc = 2;
  }
  std::cout.rdbuf(old);
  return out.str();
}

std::string write_config(const std::string& name, const std::string& yaml) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << yaml;
  return path;
}

}  // namespace

TEST(PlanCommand, TableAndJson) {
  const std::string cfg = write_config("plan_cmd.yaml",
                                       "model: {num_layers: 24, hidden_size: 2048, num_heads: 16, seq_length: 2048, "
                                       "vocab_size: 50257}\ntraining: {micro_batch_size: 2, global_batch_size: 256}\n"
                                       "precision: {dtype: bf16}\nparallel: {tensor: 2}\n");
  int rc = -1;
  std::string text = run_plan({"plan", "--config", cfg, "--gpus", "16", "--hardware", "h100-80g", "--top", "5"}, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(text.find("TFLOP/s"), std::string::npos) << text;
  EXPECT_NE(text.find("configured layout tp=2 pp=1 vpp=1 dp=8 mb=2"), std::string::npos) << text;
  EXPECT_NE(text.find("break a rule"), std::string::npos) << text;
  std::string json = run_plan({"plan", "--config", cfg, "--gpus", "16", "--json", "--recompute", "none"}, &rc);
  EXPECT_EQ(rc, 0);
  for (const char* key : {"\"tp\":", "\"pp\":", "\"vpp\":", "\"dp\":", "\"micro_batch\":", "\"tflops_per_gpu\":",
                          "\"step_time_s\":", "\"memory_bytes\":", "\"fits\":", "\"rejected\":"})
    EXPECT_NE(json.find(key), std::string::npos) << key;
  EXPECT_EQ(json.find("\"recompute\":\"full\""), std::string::npos);
  int depth = 0;
  for (char c : json) depth += c == '{' ? 1 : c == '}' ? -1 : 0;
  EXPECT_EQ(depth, 0);
  // Errors: exit 1 with a message (2 for the command line), no crash.
  EXPECT_EQ(run_plan({"plan", "--config", cfg}, &rc), "");
  EXPECT_EQ(rc, 2);
  run_plan({"plan", "--config", cfg, "--gpus", "8", "--hardware", "tpu-v9"}, &rc);
  EXPECT_EQ(rc, 1);
  run_plan({"plan", "--config", cfg, "--gpus", "8", "--frobnicate", "1"}, &rc);
  EXPECT_EQ(rc, 2);
  run_plan({"plan", "--config", cfg, "--gpus", "eight"}, &rc);
  EXPECT_EQ(rc, 2);
}

TEST(PlanCommand, StartupCheckWarnsAndNamesTheBetterLayout) {
  // A 1.3B model on 8 A100: tensor 8 with micro-batch 1 is predicted far slower than data parallelism.
  Config cfg = load_config_string(
      "backend: cuda\nmodel: {num_layers: 24, hidden_size: 2048, num_heads: 16, seq_length: 2048, vocab_size: 50257}\n"
      "training: {micro_batch_size: 1, global_batch_size: 64}\nprecision: {dtype: bf16}\nparallel: {tensor: 8}\n",
      "slow.yaml");
  const HardwareSpec& a100 = *builtin_hardware("a100-80g");
  auto warnings = layout_check_warnings(cfg, grid_layout_from_config(cfg.parallel, 8), a100, 8);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("slower than tp="), std::string::npos) << warnings[0];
  // The suggested command names the hardware as the user gave it: the built-in name, or their file.
  EXPECT_NE(warnings[0].find("--hardware a100-80g'"), std::string::npos) << warnings[0];
  cfg.logging.hardware = "configs/hardware/a100-80g.yaml";
  warnings = layout_check_warnings(cfg, grid_layout_from_config(cfg.parallel, 8), a100, 8);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("--hardware configs/hardware/a100-80g.yaml'"), std::string::npos) << warnings[0];
  cfg.logging.hardware.clear();
  // The planner's own best layout draws no warning.
  PlanOptions o;
  o.devices = 8;
  o.dtype = DType::BF16;
  Plan plan = make_plan(model_description_from_config(cfg), 64, a100, o);
  ASSERT_NE(plan.best(), nullptr);
  const LayoutSpec& b = plan.best()->layout;
  cfg.parallel.tensor = b.tp, cfg.parallel.pipeline = b.pp, cfg.parallel.virtual_pipeline = b.vpp;
  cfg.training.micro_batch_size = b.micro_batch;
  cfg.training.recompute = recompute_name(b.recompute);
  cfg.parallel.distributed_optimizer = b.distributed_optimizer;
  std::string info;
  EXPECT_TRUE(layout_check_warnings(cfg, grid_layout_from_config(cfg.parallel, 8), a100, 8, &info).empty());
  EXPECT_NE(info.find("predicted"), std::string::npos);
}

// Context parallelism for long sequences: a Llama-2-7B-shaped model (rope, RMSNorm, SwiGLU, untied) at
// 32768 tokens on 8 H100s. Without CP no layout fits (even full recomputation keeps every layer's input,
// 32768 x 4096 bf16 = 256 MiB, and the logits of a whole sequence); with CP up to 8 the best layouts are CP
// layouts, each CP layout's activations per device fall with CP, and its ring hops are charged.
TEST(Planner, ContextParallelismRanksLongSequenceLayouts) {
  ModelDescription m{32, 4096, 32, 11008, 32768, 32000, 128};
  m.position = PositionEmbedding::Rope;
  m.normalization = Normalization::RMSNorm;
  m.swiglu = true;
  m.untie_embeddings = true;
  m.add_bias_linear = false;
  const HardwareSpec hw = *builtin_hardware("h100-80g");
  PlanOptions o;
  o.devices = 8;
  o.sequence_parallel = true;
  o.distributed_optimizer = true;
  Plan without = make_plan(m, 8, hw, o);
  for (const PlanEntry& e : without.layouts) EXPECT_EQ(e.layout.cp, 1);
  o.max_context = 8;
  Plan with = make_plan(m, 8, hw, o);
  ASSERT_NE(with.best(), nullptr);
  EXPECT_GT(with.best()->layout.cp, 1) << with.best()->layout.str();
  EXPECT_GT(with.best()->time.cp_comm_hidden_s + with.best()->time.cp_comm_s, 0);
  EXPECT_TRUE(without.best() == nullptr || with.best()->time.step_s <= without.best()->time.step_s);
  // The same layout at CP 1, 2, 4 and 8 (tp 1, pp 1, no recomputation, ZeRO-1): activations per device
  // divide by about CP (the ring's buffers and fixed per-step sums aside).
  auto activations = [&](int cp) {
    LayoutSpec l;
    l.cp = cp, l.dp = 8 / cp, l.global_batch = 8, l.micro_batch = 1;
    l.distributed_optimizer = true;
    l.dtype = DType::BF16;
    return static_cast<double>(estimate_peak_memory(m, l).activations);
  };
  const double a1 = activations(1);
  for (int cp : {2, 4, 8}) {
    EXPECT_NEAR(activations(cp) / a1, 1.0 / cp, 0.15 / cp) << "cp " << cp;
  }
  // A sequence length that does not cut into 2 x CP chunks rules those CP degrees out.
  ModelDescription odd = m;
  odd.seq_length = 32768 + 4;  // 4 x 8193: divisible by 2 x 2, not by 2 x 4 or 2 x 8
  Plan p = make_plan(odd, 8, hw, o);
  for (const PlanEntry& e : p.layouts) EXPECT_EQ(odd.seq_length % (2 * e.layout.cp), 0) << e.layout.str();
}
