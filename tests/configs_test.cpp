// Tests for the shipped configs/ and model/param_count: every configs/*.yaml loads and validates; the
// published models have the published shapes and parameter counts (GPT-2 124M, a 1.3B GPT-2, GPT-3 175B),
// computed in closed form and checked against the parameter tensors the model code itself registers;
// and each large config's parallel layout is valid at the world size it is meant for (process grid,
// pipeline split, interleaved schedule).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "app/config_model.h"
#include "app/config.h"
#include "app/trainer.h"
#include "model/gpt_model.h"
#include "model/param_count.h"
#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/grid/process_grid.h"

namespace gpt {
namespace {

std::string config_path(const std::string& name) { return std::string(GPT_SOURCE_DIR) + "/configs/" + name; }

// Independent reference: the global parameter tensors a full single-rank model registers (constructing
// a chunk only describes its parameters; nothing is allocated), each tied tensor once.
int64_t registered_parameters(const ModelSpec& spec) {
  ModelSpec full = spec;
  full.tp_size = 1;
  full.tp_rank = 0;
  ModelChunk model(full, 0, full.num_layers, true, true);
  int64_t n = 0;
  for (const auto& p : model.params().params())
    if (!p->tied_copy) n += shape_numel(p->global_shape);
  return n;
}

// The layout checks the train command makes at start-up, for `world` ranks.
void expect_valid_layout(const Config& cfg, int world, int tp, int pp, int dp, int microbatches) {
  GridLayout layout = grid_layout_from_config(cfg.parallel, world);
  EXPECT_EQ(layout.tp(), tp);
  EXPECT_EQ(layout.pp(), pp);
  EXPECT_EQ(layout.dp(), dp);
  EXPECT_NO_THROW(validate_pipeline_layout(static_cast<int>(cfg.model.num_layers), layout.pp(),
                                           static_cast<int>(cfg.parallel.virtual_pipeline)));
  const int64_t per_step = cfg.training.micro_batch_size * layout.dp();
  ASSERT_EQ(cfg.training.global_batch_size % per_step, 0);
  EXPECT_EQ(cfg.training.global_batch_size / per_step, microbatches);
  EXPECT_NO_THROW(validate_schedule_args(layout.pp(), static_cast<int>(cfg.parallel.virtual_pipeline),
                                         static_cast<int>(cfg.training.global_batch_size / per_step)));
  EXPECT_EQ(cfg.model.num_heads % layout.tp(), 0);
}

TEST(ShippedConfigs, EveryConfigLoads) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(GPT_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    EXPECT_NO_THROW(load_config(entry.path().string())) << entry.path();
  }
  EXPECT_GE(count, 4);
}

TEST(ParamCount, ClosedFormMatchesTheModelsOwnTensors) {
  for (auto [layers, hidden, ffn, seq, vocab] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{2, 64, 256, 64, 256}, {3, 48, 100, 17, 301},
        {12, 768, 3072, 1024, 50304}}) {
    ModelSpec s;
    s.num_layers = layers, s.hidden = hidden, s.heads = 4, s.ffn = ffn, s.seq_length = seq;
    s.vocab_size = vocab, s.vocab_divisible_by = 1;
    EXPECT_EQ(count_gpt_parameters(s).total(), registered_parameters(s)) << layers << "x" << hidden;
  }
  EXPECT_THROW(count_gpt_parameters(2, 0, 4, 4, 4), std::invalid_argument);
}

TEST(ShippedConfigs, TinyCpu) {
  Config cfg = load_config(config_path("tiny-cpu.yaml"));
  EXPECT_EQ(cfg.backend, "cpu");
  ModelSpec spec = model_spec_from_config(cfg, 1, 0);
  EXPECT_EQ(count_gpt_parameters(spec).total(), registered_parameters(spec));
  expect_valid_layout(cfg, 1, 1, 1, 1, 2);
  expect_valid_layout(cfg, 2, 1, 1, 2, 1);  // every rank a data-parallel replica
}

TEST(ShippedConfigs, Gpt2Small124M) {
  Config cfg = load_config(config_path("gpt2-124m.yaml"));
  EXPECT_EQ(cfg.model.num_layers, 12);
  EXPECT_EQ(cfg.model.hidden_size, 768);
  EXPECT_EQ(cfg.model.num_heads, 12);
  EXPECT_EQ(cfg.model.seq_length, 1024);
  EXPECT_EQ(cfg.model.vocab_size, 50257);
  // The published 124M counts the 50257 real embedding rows (the tied head adds nothing).
  ParamBreakdown real = count_gpt_parameters(12, 768, 3072, 1024, 50257);
  EXPECT_EQ(real.total(), 124439808);
  EXPECT_EQ(real.word_embedding, 50257 * 768);
  EXPECT_EQ(real.per_layer, 7087872);
  // What a run allocates: the vocabulary padded to 50304 rows.
  ModelSpec spec = model_spec_from_config(cfg, 1, 0);
  EXPECT_EQ(spec.padded_vocab(), 50304);
  EXPECT_EQ(count_gpt_parameters(spec).total(), 124475904);
  EXPECT_EQ(registered_parameters(spec), 124475904);
  expect_valid_layout(cfg, 8, 1, 1, 8, 4);
}

TEST(ShippedConfigs, Gpt2Xl1p3B) {
  Config cfg = load_config(config_path("gpt2-1.3b.yaml"));
  EXPECT_EQ(cfg.model.num_layers, 24);
  EXPECT_EQ(cfg.model.hidden_size, 2048);
  EXPECT_EQ(cfg.model.num_heads, 16);
  EXPECT_EQ(cfg.model.seq_length, 1024);
  EXPECT_EQ(cfg.model.vocab_size, 50257);
  int64_t n = count_gpt_parameters(24, 2048, 8192, 1024, 50257).total();
  EXPECT_EQ(n, 1313626112);
  EXPECT_NEAR(double(n) / 1.3e9, 1.0, 0.02);  // "1.3B"
  ModelSpec spec = model_spec_from_config(cfg, cfg.parallel.tensor, 0);
  EXPECT_EQ(spec.padded_vocab(), 50432);  // a multiple of 128 * tensor parallel 2
  EXPECT_EQ(count_gpt_parameters(spec).total(), registered_parameters(spec));
  expect_valid_layout(cfg, 8, 2, 1, 4, 16);
}

TEST(ShippedConfigs, Gpt3175B) {
  Config cfg = load_config(config_path("gpt3-175b.yaml"));
  EXPECT_EQ(cfg.backend, "cuda");
  EXPECT_EQ(cfg.model.num_layers, 96);
  EXPECT_EQ(cfg.model.hidden_size, 12288);
  EXPECT_EQ(cfg.model.num_heads, 96);
  EXPECT_EQ(cfg.ffn_hidden(), 4 * 12288);
  EXPECT_EQ(cfg.model.seq_length, 2048);
  EXPECT_EQ(cfg.model.vocab_size, 51200);
  EXPECT_EQ(cfg.parallel.tensor, 8);
  EXPECT_EQ(cfg.parallel.pipeline, 16);
  EXPECT_GT(cfg.parallel.virtual_pipeline, 1);  // interleaved
  EXPECT_EQ(cfg.model.num_layers % (cfg.parallel.pipeline * cfg.parallel.virtual_pipeline), 0);
  EXPECT_EQ(cfg.training.global_batch_size, 1536);
  EXPECT_EQ(cfg.training.micro_batch_size, 1);
  EXPECT_EQ(cfg.precision.dtype, "bf16");
  EXPECT_FALSE(cfg.checkpoint.dir.empty());  // requeued jobs resume from it

  ModelSpec spec = model_spec_from_config(cfg, 8, 0);
  EXPECT_EQ(spec.padded_vocab(), 51200);  // already a multiple of 128 * 8
  ParamBreakdown p = count_gpt_parameters(spec);
  EXPECT_EQ(p.total(), 174615846912);
  EXPECT_NEAR(double(p.total()) / 175e9, 1.0, 0.005);  // "175B"
  EXPECT_EQ(registered_parameters(spec), p.total());
  // 128 nodes of 8 GPUs: TP 8 x PP 16 x DP 8, 192 microbatches per step; and the smallest world, one
  // replica on 16 nodes.
  expect_valid_layout(cfg, 1024, 8, 16, 8, 192);
  expect_valid_layout(cfg, 128, 8, 16, 1, 1536);
}


// Llama-2-7B (Touvron et al. 2023) and Llama-3-8B (Meta 2024) count their published sizes with their real
// vocabularies: 6.74B and 8.03B, to the parameter as Hugging Face's checkpoints hold them.
TEST(ShippedConfigs, Llama2With7B) {
  Config cfg = load_config(config_path("llama2-7b.yaml"));
  const ModelDescription m = model_description_from_config(cfg);
  EXPECT_EQ(m.position, PositionEmbedding::Rope);
  EXPECT_EQ(m.normalization, Normalization::RMSNorm);
  EXPECT_TRUE(m.swiglu && m.untie_embeddings && !m.add_bias_linear);
  EXPECT_EQ(m.query_groups(), 32);
  const ParamBreakdown real = count_gpt_parameters(m, 32000);
  EXPECT_EQ(real.total(), 6738415616);
  EXPECT_EQ(real.position_embedding, 0);
  EXPECT_EQ(real.output_layer, 32000 * 4096);
  EXPECT_EQ(real.per_layer, 4LL * 4096 * 4096 + 3LL * 4096 * 11008 + 2 * 4096);
  ModelSpec spec = model_spec_from_config(cfg, 8, 0);
  EXPECT_EQ(spec.padded_vocab(), 32768);  // a multiple of 128 * tensor parallel 8
  EXPECT_EQ(count_gpt_parameters(spec).total(), registered_parameters(spec));
  expect_valid_layout(cfg, 64, 8, 1, 8, 128);
}

TEST(ShippedConfigs, Llama3With8B) {
  Config cfg = load_config(config_path("llama3-8b.yaml"));
  const ModelDescription m = model_description_from_config(cfg);
  EXPECT_EQ(m.query_groups(), 8);
  EXPECT_EQ(m.qkv_width(), (32 + 2 * 8) * 128);  // k and v a quarter of q each
  EXPECT_EQ(m.rotary_base, 500000);
  const ParamBreakdown real = count_gpt_parameters(m, 128256);
  EXPECT_EQ(real.total(), 8030261248);
  ModelSpec spec = model_spec_from_config(cfg, 8, 0);
  EXPECT_EQ(spec.padded_vocab(), 129024);  // a multiple of 128 * tensor parallel 8
  EXPECT_EQ(count_gpt_parameters(spec).total(), registered_parameters(spec));
  expect_valid_layout(cfg, 128, 8, 1, 16, 32);
}

TEST(ShippedConfigs, TinyLlamaCpu) {
  Config cfg = load_config(config_path("tiny-llama-cpu.yaml"));
  EXPECT_EQ(cfg.ffn_hidden(), 128);  // SwiGLU's default width: 2/3 * 4 * 64, down to a multiple of 64
  ModelSpec spec = model_spec_from_config(cfg, 1, 0);
  EXPECT_EQ(count_gpt_parameters(spec).total(), registered_parameters(spec));
  expect_valid_layout(cfg, 2, 1, 1, 2, 1);  // every rank a data-parallel replica
}

// Invalid variant combinations stop with an error that names the key.
TEST(ConfigVariants, InvalidCombinationsNameTheKey) {
  auto error_of = [](const std::string& override_text) {
    try {
      load_config(config_path("tiny-llama-cpu.yaml"), {override_text});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto expect_error = [&](const std::string& override_text, const std::string& message) {
    const std::string e = error_of(override_text);
    EXPECT_NE(e.find(message), std::string::npos) << override_text << ": " << e;
  };
  expect_error("model.num_query_groups=3", "model.num_query_groups (3) must divide model.num_heads (4)");
  expect_error("model.rotary_percent=0", "model.rotary_percent must be in (0, 1]");
  expect_error("model.rotary_percent=0.1", "model.rotary_percent");  // 1.6 of 16 dims: one, not a pair
  expect_error("model.rotary_base=0", "model.rotary_base");
  expect_error("model.normalization=BatchNorm", "model.normalization");
  expect_error("model.position_embedding_type=alibi", "model.position_embedding_type");
  expect_error("parallel.tensor=4", "model.num_query_groups (2) must be divisible by parallel.tensor (4)");
}

}  // namespace
}  // namespace gpt
