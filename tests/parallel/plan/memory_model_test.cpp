// The memory model (parallel/plan/memory_model.h) against the CPU backend's exact allocation counters: real
// training runs of small models, 3 steps each, under recompute none / selective / full, fp32 and bf16,
// one process and several (tensor, pipeline, data) layouts over MPI, for the GPT model and a Llama-shaped
// one (rotary positions, RMSNorm, SwiGLU, grouped-query attention, untied output layer, no biases); the
// predicted peak bytes of each rank must equal the measured high-water mark to the byte (within 10% on
// the data-parallel ranks other than 0 of the distributed optimizer, whose shard may be smaller). Also:
// the static part alone against the buffers the trainer really allocated, and the replayed schedule order
// against parallel/pipeline/pipeline_schedule.h's tables.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>

#include "app/config_model.h"
#include "app/trainer.h"
#include "model/adamw.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/plan/memory_model.h"
#include "parallel/comm/mpi_communicator.h"
#include "tests/llama_variants.h"

using namespace gpt;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

Config small_config() {
  Config cfg;
  cfg.model.num_layers = 4;
  cfg.model.hidden_size = 64;
  cfg.model.num_heads = 4;
  cfg.model.seq_length = 32;
  cfg.model.vocab_size = 500;
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = 8;
  cfg.training.train_iters = 3;
  cfg.logging.interval = 1000;
  return cfg;
}

// small_config as a Llama-shaped model: every variant that changes a shape or a buffer at once.
Config llama_config() {
  Config cfg = small_config();
  cfg.model.position_embedding_type = "rope";
  cfg.model.normalization = "RMSNorm";
  cfg.model.swiglu = true;  // ffn 128: 2/3 of 4h rounded down to a multiple of 64
  cfg.model.num_query_groups = 2;
  cfg.model.untie_embeddings_and_output_weights = true;
  cfg.model.add_bias_linear = false;
  return cfg;
}

struct Measurement {
  int64_t peak = 0;                   // high-water mark of the whole run, above what was live before
  int64_t weights = 0, grads = 0, optimizer = 0;  // what the trainer allocated, read back from its objects
};

Measurement measure(const Config& cfg, ParallelState& ps) {
  auto be = make_backend("cpu");
  const int64_t base = static_cast<int64_t>(be->memory_in_use());
  be->reset_memory_peak();
  Measurement m;
  {
    Trainer trainer(cfg, ps, *be);
    for (ModelChunk* c : trainer.chunks()) {
      m.weights += c->params().value_buffer().bytes();
      m.grads += c->params().grad_buffer().bytes();
    }
    for (OptimizerSegment& s : trainer.optimizer().adam().segments()) {
      m.optimizer += s.m.bytes() + s.v.bytes();
      if (s.master.raw() != s.value.raw()) m.optimizer += s.master.bytes();
    }
    for (int i = 0; i < cfg.training.train_iters; ++i) trainer.step();
  }
  m.peak = static_cast<int64_t>(be->memory_peak()) - base;
  return m;
}

// Runs cfg on `ps` and compares this rank's measurement with the model's prediction for its stage.
void check(const Config& cfg, ParallelState& ps, const std::string& what) {
  Measurement got = measure(cfg, ps);
  ModelDescription dims = model_description_from_config(cfg);
  LayoutSpec layout = layout_spec_from_config(cfg, ps.layout);
  MemoryEstimate e = estimate_memory(dims, layout, ps.pp_rank());
  // Static buffers: exact, except that dp ranks other than 0 may hold a slightly smaller optimizer shard
  // (the padding of the flat buffers falls into the last shard) and the pp = 1 head gradient.
  const int64_t head_grad = layout.pp == 1 ? e.grads - got.grads : 0;
  EXPECT_EQ(e.weights, got.weights) << what;
  EXPECT_EQ(e.grads - head_grad, got.grads) << what;
  if (ps.dp_rank() == 0) {
    EXPECT_EQ(e.optimizer, got.optimizer) << what;
  }
  EXPECT_LE(got.optimizer, e.optimizer) << what;
  const double rel = double(e.total() - got.peak) / double(got.peak);
  std::printf("[rank %d] %-44s measured %10lld B  predicted %10lld B  (%+.3f%%)\n", world_rank(), what.c_str(),
              (long long)got.peak, (long long)e.total(), 100 * rel);
  if (ps.dp_rank() == 0 || !layout.distributed_optimizer) {
    EXPECT_EQ(e.total(), got.peak) << what;
  } else {
    EXPECT_LT(std::abs(rel), 0.10) << what << ": measured " << got.peak << " predicted " << e.total();
  }
}

}  // namespace

// ---- one process (every rank runs these on its own, without MPI) ----

namespace {

// `base` in fp32 and bf16 under every recompute mode, on one process.
void check_dtypes_and_recompute(const Config& base, const std::string& name) {
  for (const char* dtype : {"fp32", "bf16"})
    for (const char* recompute : {"none", "selective", "full"}) {
      Config cfg = base;
      cfg.precision.dtype = dtype;
      cfg.training.recompute = recompute;
      ParallelState ps = single_process_state();
      check(cfg, ps, name + "1x1x1 " + dtype + " recompute=" + recompute);
    }
}

}  // namespace

TEST(MemoryModel, SingleProcessRecomputeAndDtypes) { check_dtypes_and_recompute(small_config(), ""); }

TEST(MemoryModel, LlamaShapeSingleProcessRecomputeAndDtypes) {
  check_dtypes_and_recompute(llama_config(), "llama ");
}

TEST(MemoryModel, ConfigMShapeSingleProcess) {
  // Config M's shape (6 layers, hidden 384, 6 heads, vocab 50304), shortened to seq 128 so the test is quick.
  Config cfg = small_config();
  cfg.model.num_layers = 6;
  cfg.model.hidden_size = 384;
  cfg.model.num_heads = 6;
  cfg.model.seq_length = 128;
  cfg.model.vocab_size = 50304;
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = 4;
  cfg.training.train_iters = 2;
  ParallelState ps = single_process_state();
  check(cfg, ps, "config M shape (seq 128) 1x1x1");
}

TEST(MemoryModel, StaticBytesMatchParameterCounts) {
  // Parameters of the whole model = the sum over stages of each stage's share (tp = 1, no tied copy
  // counted twice except the last stage's, which is one word embedding).
  ModelDescription m{8, 64, 4, 256, 32, 500, 128};
  LayoutSpec l;
  l.pp = 4;
  l.global_batch = 8;
  int64_t sum = 0;
  for (int r = 0; r < 4; ++r)
    for (int64_t n : chunk_parameter_counts(m, l, r)) sum += n;
  const int64_t V = m.padded_vocab(1), h = 64;
  const int64_t per_layer = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * 256 + 256) + (256 * h + h);
  EXPECT_EQ(sum, V * h + 32 * h + 8 * per_layer + 2 * h + V * h);
}

TEST(MemoryModel, LlamaStaticBytesMatchParameterCounts) {
  // Grouped-query qkv, three MLP matrices, RMSNorm weights only, no biases, no position table; the untied
  // output layer on the last stage and no tied copy of the word embedding.
  const ModelDescription m = with_llama_variants({8, 64, 4, 128, 32, 500, 128}, 2);
  LayoutSpec l;
  l.pp = 4;
  l.global_batch = 8;
  const int64_t V = m.padded_vocab(1), h = 64, D = 16;
  const int64_t per_layer = 2 * h + (4 + 2 * 2) * D * h + h * h + 2 * 128 * h + 128 * h;
  EXPECT_EQ(chunk_parameter_counts(m, l, 0), std::vector<int64_t>{V * h + 2 * per_layer});
  EXPECT_EQ(chunk_parameter_counts(m, l, 3), std::vector<int64_t>{2 * per_layer + h + V * h});
  // At pipeline 1 the output layer has its own gradient in the flat buffer: no separate head gradient.
  l.pp = 1;
  const MemoryEstimate e = estimate_memory(m, l, 0);
  EXPECT_EQ(e.grads, 4 * (2 * V * h + 8 * per_layer + h));
}

TEST(MemoryModel, ReplaysTheScheduleTablesInOrder) {
  for (int p = 1; p <= 6; ++p)
    for (int v = 1; v <= 3; ++v)
      for (int m = 1; m <= 12; ++m) {
        if (v > 1 && (p == 1 || m % p)) continue;
        for (int r = 0; r < p; ++r) {
          auto passes = schedule_passes(p, v, m, r);
          PipelineSchedule table = schedule(p, v, m, r);
          ASSERT_EQ(passes.size(), table.actions.size());
          for (size_t i = 0; i < passes.size(); ++i) {
            EXPECT_EQ(passes[i].first, table.actions[i].kind) << p << " " << v << " " << m << " " << r << " " << i;
            EXPECT_EQ(passes[i].second, table.actions[i].chunk) << p << " " << v << " " << m << " " << r << " " << i;
          }
        }
      }
}

TEST(MemoryModel, RejectsImpossibleLayouts) {
  ModelDescription m{6, 64, 4, 256, 32, 500, 128};
  LayoutSpec l;
  l.global_batch = 8;
  l.pp = 4;  // 6 layers over 4 stages
  EXPECT_THROW(estimate_memory(m, l, 0), std::invalid_argument);
  l.pp = 1;
  l.tp = 3;  // 4 heads
  EXPECT_THROW(estimate_memory(m, l, 0), std::invalid_argument);
  m.num_query_groups = 2;
  l.tp = 4;  // 4 heads but 2 key/value groups
  try {
    estimate_memory(m, l, 0);
    ADD_FAILURE() << "tp 4 with 2 query groups was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("num_query_groups (2) is not divisible by tensor (4)"), std::string::npos)
        << e.what();
  }
}

// ---- layouts over MPI: groups of consecutive world ranks ----

namespace {

struct Case {
  int tp, pp, dp, vpp;
  bool zero1 = false, sp = false;
  const char* recompute = "none";
  const char* dtype = "fp32";
  int64_t global_batch = 8;  // microbatches of 2
  bool llama = false;        // llama_config() instead of small_config()
  int cp = 1;                // context parallelism: the ring attention's transients, seq_length / cp tokens
  bool tp_overlap = false;   // parallel.tp_comm_overlap: the row-block reduce-scatters' transients
};

Config case_config(const Case& k) {
  Config cfg = k.llama ? llama_config() : small_config();
  cfg.parallel.tensor = k.tp;
  cfg.parallel.pipeline = k.pp;
  cfg.parallel.data = k.dp;
  cfg.parallel.context = k.cp;
  cfg.parallel.virtual_pipeline = k.vpp;
  cfg.parallel.distributed_optimizer = k.zero1;
  cfg.parallel.sequence_parallel = k.sp;
  cfg.parallel.tp_comm_overlap = k.tp_overlap;
  cfg.training.recompute = k.recompute;
  cfg.precision.dtype = k.dtype;
  cfg.training.global_batch_size = k.global_batch;
  return cfg;
}

void check_case(const Case& k) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int size = k.tp * k.pp * k.dp * k.cp, rank = world_rank();
  ASSERT_EQ(world % size, 0);
  const Config cfg = case_config(k);
  auto group = MpiCommunicator::split(MPI_COMM_WORLD, rank / size, rank % size, "memory");
  ParallelState ps = mpi_parallel_state(GridLayout(size, k.tp, k.pp, k.dp, k.cp), *group);
  std::string what = std::string(k.llama ? "llama " : "") + (k.cp > 1 ? "cp" + std::to_string(k.cp) + " " : "") +
                     std::to_string(k.tp) + "x" + std::to_string(k.pp) + "x" + std::to_string(k.dp) + " vpp" +
                     std::to_string(k.vpp) + (k.zero1 ? " zero1" : "") + (k.sp ? " sp" : "") + (k.tp_overlap ? " tp-overlap" : "") + " " + k.dtype +
                     " recompute=" + k.recompute + " stage " + std::to_string(ps.pp_rank());
  try {
    check(cfg, ps, what);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", rank, what.c_str(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

// Many microbatches per step: sent activations and gradients are freed at the release points of
// parallel/pipeline/send_release.h, so the peak (measured = predicted, as in every case) is that of 4 microbatches.
void check_many_microbatches(const Case& k) {
  check_case(k);
  Case few = k;
  few.global_batch = 8;
  const GridLayout grid(k.tp * k.pp * k.dp, k.tp, k.pp, k.dp);
  auto predicted = [&](const Case& c, int stage) {
    const Config cfg = case_config(c);
    return estimate_memory(model_description_from_config(cfg), layout_spec_from_config(cfg, grid), stage).total();
  };
  for (int stage = 0; stage < k.pp; ++stage) EXPECT_EQ(predicted(k, stage), predicted(few, stage)) << "stage " << stage;
}

}  // namespace

TEST(MemoryModelLayouts, TensorParallel) { check_case({2, 1, 1, 1}); }
TEST(MemoryModelLayouts, TensorParallelSequenceParallel) { check_case({2, 1, 1, 1, false, true}); }
TEST(MemoryModelLayouts, PipelineBf16) { check_case({1, 2, 1, 1, false, false, "none", "bf16"}); }
TEST(MemoryModelLayouts, Pipeline) { check_case({1, 2, 1, 1}); }
TEST(MemoryModelLayouts, PipelineFullRecompute) { check_case({1, 2, 1, 1, false, false, "full"}); }
TEST(MemoryModelLayouts, InterleavedPipeline) { check_case({1, 2, 1, 2}); }
TEST(MemoryModelLayouts, DataParallel) { check_case({1, 1, 2, 1}); }
TEST(MemoryModelLayouts, DistributedOptimizerBf16) { check_case({1, 1, 2, 1, true, false, "selective", "bf16"}); }
TEST(MemoryModelLayouts, FourRanksMixed) { check_case({2, 2, 1, 1, false, true, "selective"}); }
TEST(MemoryModelLayouts, FourStagesSixteenMicrobatches) { check_many_microbatches({1, 4, 1, 1, false, false, "none", "fp32", 32}); }
TEST(MemoryModelLayouts, InterleavedSixteenMicrobatches) { check_many_microbatches({1, 2, 1, 2, false, false, "full", "bf16", 32}); }
TEST(MemoryModelLayouts, FourRanksPipelineData) { check_case({1, 2, 2, 1, true}); }
// The Llama-shaped model: grouped-query qkv split over tp (2 groups, tp 2), SwiGLU's wide fc1, RMSNorm's
// single statistic, the untied output layer on the last stage.
TEST(MemoryModelLayouts, LlamaTensorParallel) { check_case({2, 1, 1, 1, false, false, "none", "fp32", 8, true}); }
TEST(MemoryModelLayouts, LlamaTensorParallelSequenceParallelSelective) {
  check_case({2, 1, 1, 1, false, true, "selective", "bf16", 8, true});
}
TEST(MemoryModelLayouts, LlamaPipelineBf16) { check_case({1, 2, 1, 1, false, false, "none", "bf16", 8, true}); }
TEST(MemoryModelLayouts, LlamaInterleavedPipelineFullRecompute) {
  check_case({1, 2, 1, 2, false, false, "full", "fp32", 8, true});
}
TEST(MemoryModelLayouts, LlamaDistributedOptimizerBf16) {
  check_case({1, 1, 2, 1, true, false, "selective", "bf16", 8, true});
}
TEST(MemoryModelLayouts, LlamaFourRanksMixed) { check_case({2, 2, 1, 1, false, true, "full", "bf16", 8, true}); }
// Context parallelism: the rank's tokens are seq_length / cp, and the ring attention's buffers (running
// outputs, key/value blocks in flight, dK/dV accumulators) are transients of each block's attention.
TEST(MemoryModelLayouts, ContextParallel) { check_case({1, 1, 1, 1, false, false, "none", "fp32", 8, false, 2}); }
TEST(MemoryModelLayouts, ContextParallelTensorSequenceParallelBf16) {
  check_case({2, 1, 1, 1, false, true, "selective", "bf16", 8, false, 2});
}
TEST(MemoryModelLayouts, ContextParallelDataZero1) { check_case({1, 1, 2, 1, true, false, "none", "fp32", 8, false, 2}); }
TEST(MemoryModelLayouts, LlamaContext4FullRecompute) {
  check_case({1, 1, 1, 1, false, false, "full", "bf16", 8, true, 4});
}
TEST(MemoryModelLayouts, LlamaContextPipeline) { check_case({1, 2, 1, 1, false, false, "none", "fp32", 8, true, 2}); }
// The tensor-parallel overlap: each reduce-scatter holds 2 tp - 1 row blocks, the fp32 sum and its
// rounded copy while it runs; GELU's backward finishes fc2's input gradient before dfc1.
TEST(MemoryModelLayouts, TensorSequenceParallelOverlap) {
  check_case({2, 1, 1, 1, false, true, "none", "fp32", 8, false, 1, true});
}
TEST(MemoryModelLayouts, LlamaFourRanksMixedOverlapBf16) {
  check_case({2, 2, 1, 1, false, true, "selective", "bf16", 8, true, 1, true});
}
TEST(MemoryModelLayouts, TensorFourOverlapBf16) {
  check_case({4, 1, 1, 1, false, true, "none", "bf16", 8, false, 1, true});
}
