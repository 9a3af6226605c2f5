// Checkpoint <-> Hugging Face LlamaForCausalLM (config.json + model.safetensors). Our fused q|k|v rows are
// [query heads 0..H-1 | key groups 0..G-1 | value groups 0..G-1], head-major, query head h reading group
// h / (H/G) (HF's repeat_kv); fc1's rows are [gate | up]. Both rotate q and k the same way (rotate_half:
// dim i pairs with dim i + R/2, inv_freq = base^(-arange(0, R, 2)/R)), so the q_proj and k_proj rows are
// ours unchanged, with no interleaving permutation as Meta's original checkpoints would need.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <optional>

#include "app/config_model.h"
#include "app/convert.h"
#include "app/convert_tensors.h"
#include "data/json_lines.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

// `vocab`: the real vocabulary, whose rows the embedding and output layer give HF.
std::vector<TensorMap> hf_llama_names(const ModelDescription& m, int64_t vocab) {
  const int64_t q = m.heads * m.head_dim(), kv = m.query_groups() * m.head_dim(), F = m.ffn;
  std::vector<TensorMap> out = {{"embedding.word_embeddings.weight", "model.embed_tokens.weight", false, 0, vocab}};
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string ours = fmt::format("layers.{}.", l), hf = fmt::format("model.layers.{}.", l);
    const std::string qkv = ours + "attention.qkv.weight", fc1 = ours + "mlp.fc1.weight";
    out.insert(out.end(), {{ours + "ln1.weight", hf + "input_layernorm.weight"},
                           {qkv, hf + "self_attn.q_proj.weight", false, 0, q},
                           {qkv, hf + "self_attn.k_proj.weight", false, q, kv},
                           {qkv, hf + "self_attn.v_proj.weight", false, q + kv, kv},
                           {ours + "attention.proj.weight", hf + "self_attn.o_proj.weight"},
                           {ours + "ln2.weight", hf + "post_attention_layernorm.weight"},
                           {fc1, hf + "mlp.gate_proj.weight", false, 0, F},
                           {fc1, hf + "mlp.up_proj.weight", false, F, F},
                           {ours + "mlp.fc2.weight", hf + "mlp.down_proj.weight"}});
  }
  out.push_back({"final_ln.weight", "model.norm.weight"});
  if (m.untie_embeddings) out.push_back({"output_layer.weight", "lm_head.weight", false, 0, vocab});
  return out;
}

void refuse_non_llama(const ModelDescription& m, const std::string& where) {
  std::vector<std::string> problems;
  if (m.position != PositionEmbedding::Rope)
    problems.push_back("model.position_embedding_type is learned_absolute (Llama has rotary embeddings: rope)");
  else if (m.rotary_dims() != m.head_dim())
    problems.push_back(fmt::format("model.rotary_percent is {} (Llama rotates every dim of a head: 1)", m.rotary_percent));
  if (m.normalization != Normalization::RMSNorm)
    problems.push_back("model.normalization is LayerNorm (Llama has RMSNorm)");
  if (!m.swiglu) problems.push_back("model.swiglu is false (Llama's MLP is SwiGLU)");
  if (m.add_bias_linear) problems.push_back("model.add_bias_linear is true (Llama's linears have no biases)");
  refuse_inexpressible("Hugging Face Llama", where, problems);
}

// config.json's value of `key`, with errors naming the key; `fallback` when it is absent or null.
struct HfConfig {
  nlohmann::json root;
  std::string path;

  [[noreturn]] void bad(const std::string& key, const std::string& why) const {
    throw CheckpointError(fmt::format("{}: {} {}", path, key, why));
  }
  bool has(const std::string& key) const { return root.contains(key) && !root[key].is_null(); }
  int64_t integer(const std::string& key, std::optional<int64_t> fallback = {}) const {
    if (!has(key)) {
      if (!fallback) bad(key, "is missing");
      return *fallback;
    }
    if (!root[key].is_number_integer() || root[key].get<int64_t>() < 1)
      bad(key, "must be a positive integer, got " + root[key].dump());
    return root[key].get<int64_t>();
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!root[key].is_number()) bad(key, "must be a number, got " + root[key].dump());
    return root[key].get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!root[key].is_boolean()) bad(key, "must be true or false, got " + root[key].dump());
    return root[key].get<bool>();
  }
};

}  // namespace

void export_hf_llama(const std::string& checkpoint, const std::string& hf_dir) {
  const ExportSource src = open_checkpoint_for_export(checkpoint);
  const ModelDescription m = model_description_from_config(src.cfg);
  refuse_non_llama(m, "checkpoint " + src.dir);
  const int64_t V = src.meta.vocab_size;
  nlohmann::ordered_json config = {{"architectures", {"LlamaForCausalLM"}},
                                   {"model_type", "llama"},
                                   {"hidden_size", m.hidden},
                                   {"intermediate_size", m.ffn},
                                   {"num_attention_heads", m.heads},
                                   {"num_key_value_heads", m.query_groups()},
                                   {"head_dim", m.head_dim()},
                                   {"num_hidden_layers", m.num_layers},
                                   {"hidden_act", "silu"},
                                   {"rms_norm_eps", src.cfg.model.layernorm_eps},
                                   {"rope_theta", m.rotary_base},
                                   {"rope_scaling", nullptr},
                                   {"max_position_embeddings", m.seq_length},
                                   {"vocab_size", V},
                                   {"tie_word_embeddings", !m.untie_embeddings},
                                   {"attention_bias", false},
                                   {"attention_dropout", 0.0},
                                   {"mlp_bias", false},
                                   {"initializer_range", src.cfg.model.init_std},
                                   {"torch_dtype", "float32"}};
  std::error_code ec;
  fs::create_directories(hf_dir, ec);
  if (ec) throw CheckpointError("cannot create " + hf_dir + ": " + ec.message());
  export_tensors(src, hf_llama_names(m, V),
                 {{"format", "pt"}, {"source", "gpt-train"}, {"iteration", std::to_string(src.meta.iteration)}},
                 hf_dir + "/model.safetensors");
  write_file_durably(hf_dir + "/config.json", config.dump(2) + "\n");
}

Config config_from_hf_llama(const std::string& config_json, const std::string& base_config,
                            const std::vector<std::string>& sets) {
  HfConfig hf{nlohmann::json(), config_json};
  try {
    hf.root = nlohmann::json::parse(read_text_file(config_json));
  } catch (const nlohmann::json::parse_error& e) {
    throw CheckpointError(config_json + " is not valid JSON (" + json_error_text(e) + ")");
  }
  if (!hf.root.is_object()) throw CheckpointError(config_json + " is not a JSON object");
  // The architecture: a GPT2LMHeadModel (or any other) stops here, before any tensor is read.
  if (hf.has("architectures")) {
    const auto& a = hf.root["architectures"];
    if (!a.is_array() || std::find(a.begin(), a.end(), "LlamaForCausalLM") == a.end())
      hf.bad("architectures", "is " + a.dump() + ", not [\"LlamaForCausalLM\"]");
  }
  if (hf.has("model_type") && hf.root["model_type"] != "llama")
    hf.bad("model_type", "is " + hf.root["model_type"].dump() + ", not \"llama\"");
  if (!hf.has("architectures") && !hf.has("model_type"))
    throw CheckpointError(config_json + " names no architecture (architectures, model_type)");
  // What LlamaConfig allows and gpt-train's model does not have.
  if (hf.has("hidden_act") && hf.root["hidden_act"] != "silu")
    hf.bad("hidden_act", "is " + hf.root["hidden_act"].dump() + " (gpt-train's SwiGLU gates with silu)");
  if (hf.boolean("attention_bias", false)) hf.bad("attention_bias", "is true (gpt-train's Llama has no biases)");
  if (hf.boolean("mlp_bias", false)) hf.bad("mlp_bias", "is true (gpt-train's Llama has no biases)");
  if (hf.has("rope_scaling"))
    hf.bad("rope_scaling", "is " + hf.root["rope_scaling"].dump() + " (gpt-train has plain RoPE only: null)");
  const int64_t C = hf.integer("hidden_size"), H = hf.integer("num_attention_heads");
  if (C % H != 0) hf.bad("hidden_size", fmt::format("({}) is not a multiple of num_attention_heads ({})", C, H));
  if (hf.integer("head_dim", C / H) != C / H)
    hf.bad("head_dim", fmt::format("is {}, not hidden_size / num_attention_heads = {} (gpt-train's heads split the "
                                   "hidden size)",
                                   hf.integer("head_dim"), C / H));

  const int64_t G = hf.integer("num_key_value_heads", H);
  // HF LlamaConfig's defaults for absent keys (tie_word_embeddings: false, rms_norm_eps: 1e-6).
  std::vector<std::string> keys = {
      fmt::format("model.num_layers={}", hf.integer("num_hidden_layers")),
      fmt::format("model.hidden_size={}", C),
      fmt::format("model.num_heads={}", H),
      // As many groups as heads is multi-head attention, which gpt-train configs spell 0.
      fmt::format("model.num_query_groups={}", G == H ? 0 : G),
      fmt::format("model.ffn_hidden_size={}", hf.integer("intermediate_size")),
      fmt::format("model.seq_length={}", hf.integer("max_position_embeddings", 2048)),
      fmt::format("model.vocab_size={}", hf.integer("vocab_size")),
      fmt::format("model.layernorm_eps={}", hf.number("rms_norm_eps", 1e-6)),
      fmt::format("model.rotary_base={}", hf.number("rope_theta", 10000)),
      fmt::format("model.init_std={}", hf.number("initializer_range", 0.02)),
      fmt::format("model.untie_embeddings_and_output_weights={}", !hf.boolean("tie_word_embeddings", false)),
      "model.position_embedding_type=rope",
      "model.rotary_percent=1",
      "model.normalization=RMSNorm",
      "model.swiglu=true",
      "model.add_bias_linear=false"};
  keys.insert(keys.end(), sets.begin(), sets.end());
  return base_config.empty() ? load_config_string("{}", config_json, keys) : load_config(base_config, keys);
}

void import_hf_llama(const std::string& hf_dir, const Config& cfg, const std::string& checkpoint_dir) {
  const ModelDescription m = model_description_from_config(cfg);
  refuse_non_llama(m, "config " + cfg.source);
  const fs::path dir(hf_dir);
  std::string file = (dir / "model.safetensors").string();
  if (!fs::exists(file)) file = (dir / "model.safetensors.index.json").string();
  if (!fs::exists(file))
    throw CheckpointError(hf_dir + " holds neither model.safetensors nor model.safetensors.index.json");
  SafetensorsReader in(file);
  // Older exports store each layer's rotary inv_freq buffer; a tied model's file may carry the head too.
  auto hf_name = [&](const std::string& name) -> std::string {
    if (name.ends_with(".self_attn.rotary_emb.inv_freq")) return "";
    if (name == "lm_head.weight" && !m.untie_embeddings) return "";
    return name;
  };
  import_tensors(in, hf_llama_names(m, m.vocab_size), cfg, hf_name, (dir / "config.json").string(),
                 fmt::format("a Llama model with {} layers", m.num_layers), checkpoint_dir);
}

}  // namespace gpt
