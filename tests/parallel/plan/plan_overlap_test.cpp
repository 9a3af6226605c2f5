// The planner's overlap choices, GEMM efficiency table and cost breakdown:
//  - overlap sets: names, presets per backend, bad names and impossible sets are rejected naming the flag,
//    and each layout gets only the members that apply to it, with the reason for the others;
//  - the overlap rule: hidden communication never exceeds the compute it runs under (one microbatch's
//    backward for the gradient reduction), overlapped communication costs at least the slowdown of that
//    compute, and the parts of a step still add up;
//  - the GEMM table: entries are returned exactly, shapes outside are clamped, bad tables name the entry,
//    and the built-in GPUs' tables rise with size as the published figures do;
//  - hardware files: the replaced matmul_efficiency key and a missing gemm_efficiency table are errors
//    that name the key; the table survives a round trip;
//  - `plan --overlap` and `plan --explain`: the breakdown of an asked layout next to the best one, and
//    clear errors for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include "app/cli.h"
#include "app/plan.h"
#include "app/plan_explain.h"
#include "parallel/plan/planner.h"
#include "tests/error_of.h"

using namespace gpt;

namespace {

// A 32-layer, hidden-4096 model on 64 H100 with the layout the tests vary.
ModelDescription dims() { return ModelDescription{32, 4096, 32, 4 * 4096, 4096, 51200, 128}; }

LayoutSpec layout(int tp, int pp, int dp, int64_t mb, int64_t gb) {
  LayoutSpec l;
  l.tp = tp, l.pp = pp, l.dp = dp, l.micro_batch = mb, l.global_batch = gb;
  l.sequence_parallel = tp > 1;
  l.distributed_optimizer = dp > 1;
  l.dtype = DType::BF16;
  return l;
}

}  // namespace

TEST(PlannerOverlap, NamesAndPresets) {
  EXPECT_EQ(parse_overlaps("none", "cuda").str(), "none");
  EXPECT_EQ(parse_overlaps("gpt-train", "cpu").str(), "none");
  EXPECT_EQ(parse_overlaps("gpt-train", "cuda").str(), "grad-reduce");
  EXPECT_EQ(parse_overlaps("gpt-train", "cuda", true).str(), "tp,grad-reduce");
  EXPECT_EQ(parse_overlaps("gpt-train", "cpu", true).str(), "none");
  EXPECT_EQ(parse_overlaps("megatron-core", "cpu").str(), "tp-userbuffers,grad-reduce,param-gather,p2p");
  EXPECT_TRUE(parse_overlaps("tp-userbuffers,grad-reduce,param-gather,p2p", "cpu") == megatron_core_overlaps());
  EXPECT_EQ(parse_overlaps("p2p,tp", "cpu").str(), "tp,p2p");
  EXPECT_NE(error_of([] { parse_overlaps("dp", "cpu"); }).find("--overlap: unknown overlap 'dp'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_overlaps("tp,,p2p", "cpu"); }).find("unknown overlap ''"), std::string::npos);
  EXPECT_NE(error_of([] { parse_overlaps("", "cpu"); }).find("--overlap"), std::string::npos);
}

TEST(PlannerOverlap, SetsThatCanApplyToNoLayoutAreRejected) {
  const std::string tp = error_of([] { check_overlaps_for_search(megatron_core_overlaps(), false, true); });
  EXPECT_NE(tp.find("parallel.sequence_parallel"), std::string::npos) << tp;
  EXPECT_NE(tp.find("--overlap"), std::string::npos) << tp;
  const std::string pg = error_of([] { check_overlaps_for_search(parse_overlaps("grad-reduce,param-gather", ""), true, false); });
  EXPECT_NE(pg.find("--distributed-optimizer off"), std::string::npos) << pg;
  EXPECT_NE(error_of([] { check_overlaps_for_search(parse_overlaps("param-gather", ""), true, true); }).find("grad-reduce"),
            std::string::npos);
  EXPECT_EQ(error_of([] { check_overlaps_for_search(megatron_core_overlaps(), true, true); }), "no error");
  // make_plan checks the same.
  PlanOptions o;
  o.devices = 8;
  o.overlaps = megatron_core_overlaps();
  EXPECT_THROW(make_plan(dims(), 64, *builtin_hardware("h100-80g"), o), std::invalid_argument);
}

TEST(PlannerOverlap, EachLayoutGetsTheMembersThatApply) {
  std::vector<std::string> why;
  LayoutSpec l = layout(1, 1, 1, 1, 8);
  EXPECT_EQ(applicable_overlaps(megatron_core_overlaps(), l, &why).str(), "none");
  ASSERT_EQ(why.size(), 4u);
  EXPECT_NE(why[0].find("tensor 1"), std::string::npos);
  l = layout(8, 2, 4, 1, 64);
  l.vpp = 2;
  why.clear();
  EXPECT_EQ(applicable_overlaps(megatron_core_overlaps(), l, &why).str(), "tp-userbuffers,grad-reduce,param-gather,p2p");
  EXPECT_TRUE(why.empty());
  l.vpp = 1, l.distributed_optimizer = false, l.sequence_parallel = false;
  EXPECT_EQ(applicable_overlaps(megatron_core_overlaps(), l, &why).str(), "grad-reduce");
  EXPECT_EQ(why.size(), 3u);
  // A layout that asks for an overlap it cannot have is an error naming the rule.
  l.overlaps = megatron_core_overlaps();
  const std::string e = error_of([&] { estimate_time(dims(), l, *builtin_hardware("h100-80g")); });
  EXPECT_NE(e.find("tp: not applicable"), std::string::npos) << e;
}

TEST(PlannerOverlap, HidesAtMostTheComputeItRunsUnder) {
  const HardwareSpec& h100 = *builtin_hardware("h100-80g");
  // Tensor 8 with sequence parallelism, 8 microbatches, pipeline 2 interleaved, data 4: every overlap applies.
  LayoutSpec plain = layout(8, 2, 4, 1, 32);
  plain.vpp = 2;
  LayoutSpec over = plain;
  over.overlaps = megatron_core_overlaps();
  std::vector<CostLine> lines;
  const TimeEstimate a = estimate_time(dims(), plain, h100), b = estimate_time(dims(), over, h100, &lines);
  EXPECT_DOUBLE_EQ(a.tp_comm_hidden_s + a.pp_comm_hidden_s + a.dp_comm_hidden_s, 0.0);
  EXPECT_GT(b.tp_comm_hidden_s, 0);
  EXPECT_GT(b.dp_comm_hidden_s, 0);
  EXPECT_LT(b.step_s, a.step_s);
  // Hidden never exceeds the transfers themselves, nor the compute beside them.
  EXPECT_LE(b.tp_comm_hidden_s, a.tp_comm_s + 1e-12);
  EXPECT_LE(b.pp_comm_hidden_s, a.pp_comm_s + 1e-12);
  EXPECT_LE(b.tp_comm_hidden_s, b.compute_s);
  // The data-parallel transfers of this two-stage, two-chunk pipeline hide under the passes beside them:
  // the first chunk's under its last backward and first forward, the second's under the p chunk passes
  // before or after it, so under at most (1 + p) / v of one microbatch's compute on the stage: with 8
  // microbatches, 1.5 / 8 of the stage's compute.
  double grad_hidden = 0, param_hidden = 0;
  for (const CostLine& c : lines) {
    if (c.label == "hidden under the last backward") grad_hidden = c.seconds;
    if (c.label == "hidden under the first forward") param_hidden = c.seconds;
  }
  EXPECT_GT(grad_hidden, 0);
  EXPECT_LE(grad_hidden + param_hidden, 1.5 * b.compute_s / plain.microbatches() + 1e-12);
  // What is hidden still costs: the compute it runs under is slowed (18.9%, docs/planner.md).
  EXPECT_GE(b.tp_comm_s, 0.189 * b.tp_comm_hidden_s - 1e-12);
  // The exposed parts add up to the step.
  EXPECT_NEAR(b.compute_s + b.tp_comm_s + b.pp_comm_s + b.bubble_s + b.dp_comm_s + b.optimizer_s, b.step_s, 1e-9 * b.step_s);
  // The breakdown's compute lines add up to the compute, and it ends with the step.
  double compute = 0;
  for (const CostLine& c : lines)
    if (c.section == "compute" && c.label != "compute total") compute += c.seconds;
  EXPECT_NEAR(compute, b.compute_s, 1e-9 * b.compute_s);
  EXPECT_EQ(lines.back().label, "step time");
  EXPECT_DOUBLE_EQ(lines.back().seconds, b.step_s);
}

// ---- the GEMM efficiency table ----

// Megatron-Core splits only the first pipeline rank's first chunk into gradient buckets; the bucket
// that holds the word embedding is the last to complete in backward and the first needed in forward, and
// the first layers' bucket (max(40M, 1M x dp) parameters) comes just before it in backward and just after
// it in forward, so neither is beside compute. Pipeline 1, data 8 on one node: the embedding (51200 x
// 4096) and a 40M bucket stay exposed in both transfers however long the backward is.
TEST(PlannerOverlap, EmbeddingBucketIsNeverHidden) {
  const HardwareSpec& h100 = *builtin_hardware("h100-80g");
  LayoutSpec l = layout(1, 1, 8, 4, 32);  // one microbatch per step
  l.distributed_optimizer = true;
  l.overlaps.grad_reduce = l.overlaps.param_gather = true;
  const ModelDescription m = dims();
  std::vector<CostLine> lines;
  const TimeEstimate e = estimate_time(m, l, h100, &lines);
  double grad = 0, param = 0, hidden = 0;
  for (const CostLine& c : lines) {
    if (c.label == "gradient reduction") grad = c.seconds;
    if (c.label == "parameter all-gather") param = c.seconds;
    if (c.label == "hidden under the last backward" || c.label == "hidden under the first forward") hidden += c.seconds;
  }
  int64_t params = 0;
  for (int64_t c : chunk_parameter_counts(m, l, 0)) params += c;
  const double share = (51200.0 * 4096 + 40e6) / static_cast<double>(params);
  ASSERT_GT(grad, 0);
  ASSERT_GT(e.compute_s, 10 * (grad + param));  // compute alone could hide everything
  EXPECT_NEAR(hidden, (1 - share) * (grad + param), 1e-9);
  EXPECT_NEAR(e.dp_comm_s, share * (grad + param) + 0.189 * hidden, 1e-9);
}

// Megatron's unfused cross entropy moves 48 + 2d bytes per logit (fp32 cast, max, subtract, exp, sum,
// divide; backward scale and cast back) against the fused loss's 20: in bf16, 32 bytes more per logit of
// each microbatch's [b s, V / t] logits, at the hardware's memory bandwidth.
TEST(PlannerTimeModel, UnfusedCrossEntropyChargesItsPasses) {
  const HardwareSpec& h100 = *builtin_hardware("h100-80g");
  const ModelDescription m = dims();
  LayoutSpec fused = layout(2, 1, 4, 2, 32);
  LayoutSpec unfused = fused;
  unfused.unfused_cross_entropy = true;
  const double logits = 2.0 * 4096 * static_cast<double>(m.padded_vocab(2)) / 2;  // b s x V / t per microbatch
  const double bandwidth = h100.loss_bandwidth_gbs > 0 ? h100.loss_bandwidth_gbs * 1e9
                                                       : h100.memory_bandwidth_gbs * 1e9 * h100.memory_efficiency;
  const double extra = static_cast<double>(fused.microbatches()) * (48 + 2 * 2 - 20) * logits / bandwidth;
  EXPECT_NEAR(estimate_time(m, unfused, h100).compute_s - estimate_time(m, fused, h100).compute_s, extra, 1e-9);
  EXPECT_NE(unfused.str().find("unfused_cross_entropy"), std::string::npos);
}

// Megatron's sequence parallelism keeps a column-parallel linear's local input rows and gathers them
// again in backward: per layer two fewer full-row [N, h] tensors in the cache (ln1_full, ln2_full), and
// two more all-gathers per layer in backward.
TEST(PlannerTimeModel, RegatheredSequenceParallelInputsTradeMemoryForCollectives) {
  const HardwareSpec& h100 = *builtin_hardware("h100-80g");
  const ModelDescription m = dims();
  LayoutSpec kept = layout(8, 2, 4, 1, 32);  // sequence parallel
  LayoutSpec regathered = kept;
  regathered.regather_sp_inputs = true;
  const MemoryEstimate a = estimate_memory(m, kept, 1), b = estimate_memory(m, regathered, 1);
  const int64_t full_rows = 1 * 4096 * 4096 * 2;  // N x h in bf16
  EXPECT_EQ(a.activation_cache - b.activation_cache, 16 * 2 * full_rows);  // 16 layers on the stage
  EXPECT_LT(b.activations, a.activations);
  std::vector<CostLine> la, lb;
  const TimeEstimate ta = estimate_time(m, kept, h100, &la), tb = estimate_time(m, regathered, h100, &lb);
  auto note = [](const std::vector<CostLine>& lines) {
    for (const CostLine& c : lines)
      if (c.section == "tensor parallel" && c.label == "collectives") return c.note;
    return std::string();
  };
  EXPECT_EQ(note(la), "8 per layer and microbatch, sequence parallel");
  EXPECT_EQ(note(lb), "10 per layer and microbatch, sequence parallel");
  EXPECT_GT(tb.tp_comm_s, ta.tp_comm_s);  // the re-gathers run beside dgrad, but still cost
  EXPECT_GT(tb.tp_comm_hidden_s, 0);      // Megatron starts them asynchronously even without the tp overlap
  EXPECT_NE(regathered.str().find("regather_sp_inputs"), std::string::npos);
}

// Transformer Engine's userbuffers (the megatron-core set): ring exchanges on the copy engines slow the
// GEMM beside them by nothing, pipelined and bulk transfers by the 16 SMs they take (16 / (132 - 16) on an
// H100); without an SM count the average slowdown applies to all.
TEST(PlannerOverlap, UserbuffersChargeTheSmsTheyTake) {
  const ModelDescription m = dims();
  LayoutSpec l = layout(8, 1, 8, 1, 8);
  l.overlaps = megatron_core_overlaps();
  l.overlaps = applicable_overlaps(l.overlaps, l);
  ASSERT_TRUE(l.overlaps.tp_userbuffers);
  LayoutSpec nccl = l;
  nccl.overlaps.tp_userbuffers = false;
  const HardwareSpec& h100 = *builtin_hardware("h100-80g");
  EXPECT_LT(estimate_time(m, l, h100).tp_comm_s, estimate_time(m, nccl, h100).tp_comm_s);
  EXPECT_DOUBLE_EQ(estimate_time(m, l, h100).tp_comm_hidden_s, estimate_time(m, nccl, h100).tp_comm_hidden_s);
  HardwareSpec unknown = h100;
  unknown.sm_count = 0;
  EXPECT_DOUBLE_EQ(estimate_time(m, l, unknown).tp_comm_s, estimate_time(m, nccl, unknown).tp_comm_s);
  // The flag follows tp: a layout tp overlap cannot apply to does not keep it.
  LayoutSpec one = layout(1, 1, 64, 1, 64);
  EXPECT_FALSE(applicable_overlaps(megatron_core_overlaps(), one).tp_userbuffers);
}

TEST(GemmEfficiency, EntriesClampingAndErrors) {
  const GemmEfficiencyTable t({{1024, 1024, 1024, 0.2}, {4096, 4096, 4096, 0.8}, {4096, 1024, 4096, 0.6}});
  EXPECT_DOUBLE_EQ(t.at(1024, 1024, 1024), 0.2);
  EXPECT_DOUBLE_EQ(t.at(4096, 1024, 4096), 0.6);
  EXPECT_DOUBLE_EQ(t.at(65536, 65536, 65536), 0.8);  // clamped to the largest entry
  EXPECT_DOUBLE_EQ(t.at(16, 16, 16), 0.2);            // and to the smallest
  const double mid = t.at(2048, 2048, 2048);
  EXPECT_GT(mid, 0.2);
  EXPECT_LT(mid, 0.8);
  EXPECT_DOUBLE_EQ(t.best(), 0.8);
  EXPECT_NE(error_of([] { GemmEfficiencyTable().validate(); }).find("no entries"), std::string::npos);
  EXPECT_NE(error_of([] { GemmEfficiencyTable({{1, 1, 1, 1.5}}).validate(); }).find("entry 1"), std::string::npos);
  EXPECT_NE(error_of([] { GemmEfficiencyTable({{8, 8, 8, 0.5}, {8, 8, 8, 0.4}}).validate(); }).find("same shape as entry 1"),
            std::string::npos);
}

TEST(GemmEfficiency, BuiltInGpusRiseWithSizeAsPublished) {
  // OpenXLA's sm_90 table and the cookbook's A100 figures: cubes from 1024 to 4096 get faster.
  const GemmEfficiencyTable& h100 = builtin_hardware("h100-80g")->gemm_efficiency;
  EXPECT_NEAR(h100.at(1024, 1024, 1024), 236.3 / 989, 1e-3);
  EXPECT_NEAR(h100.at(4096, 4096, 4096), 783.3 / 989, 1e-3);
  EXPECT_LT(h100.at(2048, 2048, 2048), h100.at(4096, 4096, 4096));
  const GemmEfficiencyTable& a100 = builtin_hardware("a100-80g")->gemm_efficiency;
  EXPECT_NEAR(a100.at(4096, 4096, 4096), 239.130 / 312, 1e-3);
  EXPECT_LT(a100.at(2048, 2048, 4096), a100.at(8192, 8192, 4096));
  EXPECT_EQ(builtin_hardware("h200")->gemm_efficiency.entries().size(), h100.entries().size());
}

// ---- hardware files ----

TEST(PlannerHardware, GemmTableIsRequiredAndRoundTrips) {
  const std::string good = hardware_to_yaml(*builtin_hardware("h100-80g"));
  const HardwareSpec back = hardware_from_yaml(good, "h100.yaml");
  ASSERT_EQ(back.gemm_efficiency.entries().size(), builtin_hardware("h100-80g")->gemm_efficiency.entries().size());
  EXPECT_DOUBLE_EQ(back.gemm_efficiency.at(2048, 4096, 1024), builtin_hardware("h100-80g")->gemm_efficiency.at(2048, 4096, 1024));
  const std::string without = good.substr(0, good.find("gemm_efficiency:"));
  auto message = [](const std::string& yaml) { return error_of([&] { hardware_from_yaml(yaml, "old.yaml"); }); };
  const std::string missing = message(without);
  EXPECT_NE(missing.find("hardware file old.yaml: missing key 'gemm_efficiency'"), std::string::npos) << missing;
  const std::string replaced = message(without + "matmul_efficiency: 0.7\n");
  EXPECT_NE(replaced.find("key 'matmul_efficiency' was replaced by the table 'gemm_efficiency'"), std::string::npos) << replaced;
  EXPECT_NE(message(without + "gemm_efficiency: 0.7\n").find("needs a list"), std::string::npos);
  EXPECT_NE(message(without + "gemm_efficiency:\n  - [1024, 1024, 0.5]\n").find("gemm_efficiency entry 1 must be [m, n, k, efficiency]"),
            std::string::npos);
  EXPECT_NE(message(without + "gemm_efficiency:\n  - [1024, 1024, lots, 0.5]\n").find("four numbers"), std::string::npos);
  EXPECT_NE(message(without + "gemm_efficiency:\n  - [1024, 1024, 1024, 1.5]\n").find("gemm_efficiency"), std::string::npos);
}

// ---- the command ----

namespace {

// The plan subcommand as main runs it: 2 (and the message) for a command line it refuses, else
// plan_main's status and what it wrote to stderr.
std::string run_plan_command(const std::vector<std::string>& argv, int* rc, std::string* err = nullptr) {
  std::ostringstream out, errors;
  auto* old = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(errors.rdbuf());
  std::string refused;
  try {
    *rc = parse_command_line(argv).run();
  } catch (const CliError& e) {
    *rc = 2;
    refused = e.what();
  }
  std::cout.rdbuf(old);
  std::cerr.rdbuf(old_err);
  if (err) *err = refused.empty() ? errors.str() : refused;
  return out.str();
}

std::string config_file(bool sequence_parallel) {
  std::string path = ::testing::TempDir() + (sequence_parallel ? "plan_overlap_sp.yaml" : "plan_overlap.yaml");
  std::ofstream(path) << "backend: cuda\nmodel: {num_layers: 32, hidden_size: 4096, num_heads: 32, seq_length: 4096, "
                         "vocab_size: 51200}\ntraining: {micro_batch_size: 1, global_batch_size: 64}\n"
                         "precision: {dtype: bf16}\nparallel: {sequence_parallel: "
                      << (sequence_parallel ? "true" : "false") << "}\n";
  return path;
}

}  // namespace

TEST(PlanCommand, OverlapAndExplain) {
  const std::string cfg = config_file(true);
  int rc = -1;
  std::string err;
  std::string text = run_plan_command({"plan", "--config", cfg, "--gpus", "16", "--top", "3"}, &rc);
  EXPECT_EQ(rc, 0);
  // The default is what gpt-train does on the config's backend (cuda: the gradient reduction).
  EXPECT_NE(text.find("overlap of communication with compute: grad-reduce"), std::string::npos) << text;
  text = run_plan_command({"plan", "--config", cfg, "--gpus", "16", "--overlap", "megatron-core", "--explain", "8,1,2"}, &rc);
  EXPECT_EQ(rc, 0) << text;
  for (const char* want : {"asked (8,1,2): tp=8 pp=1", "best:", "GEMM qkv", "at ", "hidden under GEMMs", "bubble",
                           "hidden under the last backward", "optimizer", "step time", "memory per device",
                           "overlaps, asked", "applied: tp-userbuffers,grad-reduce", "p2p: not applicable"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  // Megatron's executor options reach the layouts (shown in the layout's description).
  text = run_plan_command({"plan", "--config", cfg, "--gpus", "16", "--overlap", "megatron-core", "--loss", "unfused",
                           "--sp-inputs", "regathered", "--explain", "8,1,2"},
                          &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("unfused_cross_entropy regather_sp_inputs"), std::string::npos) << text;
  EXPECT_NE(text.find("why: "), std::string::npos) << text;
  run_plan_command({"plan", "--config", cfg, "--gpus", "16", "--loss", "sometimes"}, &rc, &err);
  EXPECT_EQ(rc, 2);
  // Bad input: refused with the flag named (exit 2), or exit 1 with a message naming the key or the rule.
  run_plan_command({"plan", "--config", cfg, "--gpus", "16", "--overlap", "sometimes"}, &rc, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("--overlap: unknown overlap 'sometimes'"), std::string::npos) << err;
  run_plan_command({"plan", "--config", config_file(false), "--gpus", "16", "--overlap", "megatron-core"}, &rc, &err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("parallel.sequence_parallel"), std::string::npos) << err;
  run_plan_command({"plan", "--config", cfg, "--gpus", "16", "--explain", "8,1"}, &rc, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("--explain: expected TP,PP,DP"), std::string::npos) << err;
  run_plan_command({"plan", "--config", cfg, "--gpus", "16", "--explain", "8,1,4"}, &rc, &err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("is 32, but the plan is for 16 devices"), std::string::npos) << err;
  run_plan_command({"plan", "--config", cfg, "--gpus", "16", "--explain", "16,1,1"}, &rc, &err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("would cross nodes"), std::string::npos) << err;
  run_plan_command({"plan", "--config", cfg, "--gpus", "16", "--explain", "8,1,2", "--json"}, &rc, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("--explain prints text"), std::string::npos) << err;
}
