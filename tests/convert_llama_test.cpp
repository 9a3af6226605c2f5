// `gpt-train convert` to and from Hugging Face LlamaForCausalLM. A tiny Llama-shaped model (RoPE, RMSNorm,
// SwiGLU, no biases; grouped-query and untied, or multi-head and tied) trained a few steps is exported
// through the command line; an independent NumPy Llama written from HF's conventions
// (tests/hf_llama_reference.py) reproduces our loss on a validation batch from config.json and
// model.safetensors alone; importing the export gives back every tensor bit for bit, and so does a BF16
// copy in two shards. Then the models and files that are not a Llama gpt-train can express.
#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>

#include "app/convert.h"
#include "tests/parallel/checkpoint/checkpoint_test_util.h"
#include "tests/error_of.h"
#include "tests/gpt_train_process.h"

using namespace gpt;
using namespace gpt::ckpt_test;

namespace {

const std::string kReference = std::string(GPT_SOURCE_DIR) + "/tests/hf_llama_reference.py";

// 2 layers, hidden 64, 4 heads in 2 query groups, sequence 32, vocabulary 200 (padded to 256: the export
// drops 56 rows), untied; rotary base and eps away from their defaults so that config.json must carry them.
Config llama_config(const std::string& dir) {
  Config cfg = small_config();
  cfg.model.hidden_size = 64;
  cfg.model.num_heads = 4;
  cfg.model.num_query_groups = 2;
  cfg.model.seq_length = 32;
  cfg.model.vocab_size = 200;
  cfg.model.position_embedding_type = "rope";
  cfg.model.rotary_base = 1000;
  cfg.model.normalization = "RMSNorm";
  cfg.model.layernorm_eps = 1e-6;
  cfg.model.swiglu = true;
  cfg.model.add_bias_linear = false;
  cfg.model.untie_embeddings_and_output_weights = true;
  cfg.training.train_iters = 30;  // far enough from the uniform loss that wrong weights show
  cfg.optimizer.decay_iters = 30;
  cfg.data.synthetic = "pattern";
  cfg.checkpoint.dir = dir + "/trained";
  return cfg;
}

// The bytes after the safetensors header: the tensors.
std::string tensor_bytes(const std::string& file) {
  const std::string s = read_text_file(file);
  uint64_t n = 0;
  std::memcpy(&n, s.data(), 8);
  return s.substr(8 + n);
}

// Trains `cfg`, exports it to dir/hf through the command line, checks the NumPy Llama's loss on the first
// validation batch against ours, then imports the export (and a BF16 sharded copy of it) back and checks
// every tensor, the loss and a second export.
void check_export_import(const Config& cfg, const std::string& dir) {
  ParallelState ps = single_process_state();
  auto be = make_backend("cpu");
  Trainer trained(cfg, ps, *be);
  trained.train();
  const auto weights = trained.gather_global_params();
  const double loss = score_first_valid_batch(trained, cfg, dir + "/tokens.bin");

  ASSERT_EQ(run_gpt_train({"convert", "--from", cfg.checkpoint.dir, "--to", dir + "/hf"}, dir + "/export.log"), 0)
      << read_text_file(dir + "/export.log");
  const std::string out = run_python(kReference, {"loss", dir + "/hf", dir + "/tokens.bin"});
  ASSERT_EQ(out.rfind("FAILED", 0), std::string::npos) << out;
  // fp32 against float64 agree to about 1e-8 here; the interleaved-pairs RoPE convention (Meta's original
  // layout, which would need a q/k row permutation) is off by about 5e-5.
  EXPECT_NEAR(std::stod(out), loss, 1e-6 * loss) << out;
  EXPECT_LT(loss, 0.9 * std::log(double(cfg.model.vocab_size)));

  // Import through the command line (config.json gives the model); a run loading it holds exactly the
  // trained weights, the real vocabulary rows of the embedding and output layer included.
  ASSERT_EQ(run_gpt_train({"convert", "--from", dir + "/hf", "--to", dir + "/imported"}, dir + "/import.log"), 0)
      << read_text_file(dir + "/import.log");
  expect_imported(cfg, dir + "/imported", weights, loss);

  // Exporting the imported checkpoint gives the same tensor bytes and the same config.json.
  export_hf_llama(dir + "/imported", dir + "/again");
  EXPECT_EQ(tensor_bytes(dir + "/hf/model.safetensors"), tensor_bytes(dir + "/again/model.safetensors"));
  EXPECT_EQ(read_text_file(dir + "/hf/config.json"), read_text_file(dir + "/again/config.json"));

  // BF16 in two shards with an index: the import widens each value exactly.
  ASSERT_EQ(run_python(kReference, {"to_bf16_shards", dir + "/hf", dir + "/bf16"}), "");
  const Config bf16_cfg = config_from_hf_llama(dir + "/bf16/config.json", "", {});
  import_hf_llama(dir + "/bf16", bf16_cfg, dir + "/imported_bf16");
  export_hf_llama(dir + "/imported_bf16", dir + "/again_bf16");
  EXPECT_EQ(run_python(kReference, {"same_as_bf16", dir + "/again_bf16", dir + "/bf16"}), "ok\n");
}

TEST(ConvertLlama, GroupedQueryUntiedExportIsReadByNumpyLlamaAndImportRoundTripsBitExactly) {
  const TempDir tmp("llama_gqa");
  check_export_import(llama_config(tmp.path), tmp.path);
}

TEST(ConvertLlama, MultiHeadTiedExportIsReadByNumpyLlamaAndImportRoundTripsBitExactly) {
  const TempDir tmp("llama_tied");
  Config cfg = llama_config(tmp.path);
  cfg.model.num_query_groups = 0;
  cfg.model.untie_embeddings_and_output_weights = false;
  check_export_import(cfg, tmp.path);
}

// A copy of Hugging Face directory `from` at `to` with config.json edited by `edit`.
void edited_copy(const std::string& from, const std::string& to, const std::function<void(nlohmann::json&)>& edit) {
  fs::create_directories(to);
  fs::copy_file(from + "/model.safetensors", to + "/model.safetensors", fs::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::parse(read_text_file(from + "/config.json"));
  edit(config);
  write_text(to + "/config.json", config.dump());
}

TEST(ConvertLlama, RefusesWhatLlamaCannotExpressAndFilesThatAreNotItsModel) {
  const TempDir tmp("llama_errors");
  const std::string& dir = tmp.path;
  ParallelState ps = single_process_state();
  auto be = make_backend("cpu");
  Config llama = llama_config(dir);
  llama.training.train_iters = 1;
  Trainer(llama, ps, *be).train();
  export_hf_llama(llama.checkpoint.dir, dir + "/hf");

  // A GPT-2 checkpoint: every key Llama cannot express is named.
  Config gpt2 = small_config();
  gpt2.training.train_iters = 1;
  gpt2.checkpoint.dir = dir + "/gpt2";
  Trainer(gpt2, ps, *be).train();
  std::string e = error_of([&] { export_hf_llama(gpt2.checkpoint.dir, dir + "/out"); });
  for (const char* key : {"Hugging Face Llama cannot express this model", "model.position_embedding_type is learned_absolute",
                          "model.normalization is LayerNorm", "model.swiglu is false", "model.add_bias_linear is true"})
    EXPECT_TRUE(contains(e, key)) << key << " in: " << e;
  // ... and the other way round for GPT-2.
  e = error_of([&] { export_hf_gpt2(llama.checkpoint.dir, dir + "/out.safetensors"); });
  for (const char* key : {"Hugging Face GPT-2 cannot express this model", "model.position_embedding_type is rope",
                          "model.normalization is RMSNorm", "model.swiglu is true", "model.num_query_groups is 2",
                          "model.untie_embeddings_and_output_weights is true", "model.add_bias_linear is false"})
    EXPECT_TRUE(contains(e, key)) << key << " in: " << e;
  Config partial = config_from_hf_llama(dir + "/hf/config.json", "", {"model.rotary_percent=0.5"});
  e = error_of([&] { import_hf_llama(dir + "/hf", partial, dir + "/bad"); });
  EXPECT_TRUE(contains(e, "model.rotary_percent is 0.5 (Llama rotates every dim of a head: 1)")) << e;

  // config.json of another architecture, through the command line.
  edited_copy(dir + "/hf", dir + "/gpt2_hf", [](nlohmann::json& c) {
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
  });
  EXPECT_EQ(run_gpt_train({"convert", "--from", dir + "/gpt2_hf", "--to", dir + "/bad"}, dir + "/gpt2_hf.log"), 1);
  e = read_text_file(dir + "/gpt2_hf.log");
  EXPECT_TRUE(contains(e, "config.json: architectures is [\"GPT2LMHeadModel\"], not [\"LlamaForCausalLM\"]")) << e;

  // config.json keys gpt-train cannot follow, or that are missing.
  const std::pair<std::function<void(nlohmann::json&)>, const char*> bad_configs[] = {
      {[](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}}; }, "rope_scaling is"},
      {[](nlohmann::json& c) { c["hidden_act"] = "gelu"; }, "hidden_act is \"gelu\""},
      {[](nlohmann::json& c) { c["attention_bias"] = true; }, "attention_bias is true"},
      {[](nlohmann::json& c) { c["head_dim"] = 32; }, "head_dim is 32"},
      {[](nlohmann::json& c) { c.erase("hidden_size"); }, "hidden_size is missing"},
      {[](nlohmann::json& c) { c["num_hidden_layers"] = "2"; }, "num_hidden_layers must be a positive integer"}};
  for (const auto& [edit, message] : bad_configs) {
    edited_copy(dir + "/hf", dir + "/edited", edit);
    e = error_of([&] { config_from_hf_llama(dir + "/edited/config.json", "", {}); });
    EXPECT_TRUE(contains(e, message)) << message << " in: " << e;
  }

  // Tensors that do not fit config.json: misshapen, missing, left over; no tensor file at all.
  auto import_error = [&](const std::function<void(nlohmann::json&)>& edit) {
    edited_copy(dir + "/hf", dir + "/edited", edit);
    const Config cfg = config_from_hf_llama(dir + "/edited/config.json", "", {});
    return error_of([&] { import_hf_llama(dir + "/edited", cfg, dir + "/bad"); });
  };
  e = import_error([](nlohmann::json& c) { c["num_key_value_heads"] = 4; });
  EXPECT_TRUE(contains(e, "tensor model.layers.0.self_attn.k_proj.weight has shape [32, 64], " + dir +
                              "/edited/config.json needs [64, 64]")) << e;
  e = import_error([](nlohmann::json& c) { c["num_hidden_layers"] = 3; });
  EXPECT_TRUE(contains(e, "has no tensor model.layers.2.input_layernorm.weight (a Llama model with 3 layers)")) << e;
  e = import_error([](nlohmann::json& c) { c["num_hidden_layers"] = 1; });
  EXPECT_TRUE(contains(e, "tensor model.layers.1.") && contains(e, "is not part of a Llama model with 1 layers")) << e;
  fs::remove(dir + "/edited/model.safetensors");
  const Config cfg = config_from_hf_llama(dir + "/edited/config.json", "", {});
  e = error_of([&] { import_hf_llama(dir + "/edited", cfg, dir + "/bad"); });
  EXPECT_TRUE(contains(e, "holds neither model.safetensors nor model.safetensors.index.json")) << e;
  EXPECT_FALSE(fs::exists(dir + "/bad/latest"));
}

}  // namespace
