// Checkpoint <-> Hugging Face GPT-2 safetensors (one file), and `gpt-train convert`, which also reaches the
// Llama conversion (app/convert_llama.cpp). The tensor walk both share is app/convert_tensors.cpp.
#include "app/convert.h"

#include <filesystem>
#include <fmt/format.h>
#include <iostream>

#include "app/config_model.h"
#include "app/convert_tensors.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

std::vector<TensorMap> hf_gpt2_names(int64_t num_layers, int64_t vocab) {
  std::vector<TensorMap> out = {{"embedding.word_embeddings.weight", "transformer.wte.weight", false, 0, vocab},
                                {"embedding.position_embeddings.weight", "transformer.wpe.weight"}};
  const std::pair<const char*, const char*> block[] = {
      {"ln1.weight", "ln_1.weight"},         {"ln1.bias", "ln_1.bias"},
      {"attention.qkv.weight", "attn.c_attn.weight"}, {"attention.qkv.bias", "attn.c_attn.bias"},
      {"attention.proj.weight", "attn.c_proj.weight"}, {"attention.proj.bias", "attn.c_proj.bias"},
      {"ln2.weight", "ln_2.weight"},         {"ln2.bias", "ln_2.bias"},
      {"mlp.fc1.weight", "mlp.c_fc.weight"}, {"mlp.fc1.bias", "mlp.c_fc.bias"},
      {"mlp.fc2.weight", "mlp.c_proj.weight"}, {"mlp.fc2.bias", "mlp.c_proj.bias"}};
  for (int64_t l = 0; l < num_layers; ++l)
    for (auto [ours, hf] : block) {
      const std::string o = ours;
      out.push_back({fmt::format("layers.{}.{}", l, o), fmt::format("transformer.h.{}.{}", l, hf),
                     o.ends_with(".weight") && o.find("ln") != 0});
    }
  out.push_back({"final_ln.weight", "transformer.ln_f.weight"});
  out.push_back({"final_ln.bias", "transformer.ln_f.bias"});
  return out;
}

// GPT-2 is the default model: every variant key must keep its default.
void refuse_non_gpt2(const ModelDescription& m, const std::string& where) {
  std::vector<std::string> problems;
  if (m.position != PositionEmbedding::LearnedAbsolute)
    problems.push_back("model.position_embedding_type is rope (GPT-2 learns absolute positions)");
  if (m.normalization != Normalization::LayerNorm)
    problems.push_back("model.normalization is RMSNorm (GPT-2 has LayerNorm)");
  if (m.swiglu) problems.push_back("model.swiglu is true (GPT-2's MLP is GELU)");
  if (m.query_groups() != m.heads)
    problems.push_back(fmt::format("model.num_query_groups is {} (GPT-2 has a key/value head per query head)",
                                   m.num_query_groups));
  if (m.untie_embeddings)
    problems.push_back("model.untie_embeddings_and_output_weights is true (GPT-2 ties the output layer to the word "
                       "embedding)");
  if (!m.add_bias_linear) problems.push_back("model.add_bias_linear is false (GPT-2's linears have biases)");
  refuse_inexpressible("Hugging Face GPT-2", where, problems);
}

}  // namespace

void export_hf_gpt2(const std::string& checkpoint, const std::string& safetensors_file) {
  const ExportSource src = open_checkpoint_for_export(checkpoint);
  const ModelDescription m = model_description_from_config(src.cfg);
  refuse_non_gpt2(m, "checkpoint " + src.dir);
  const int64_t V = src.meta.vocab_size;
  export_tensors(src, hf_gpt2_names(m.num_layers, V),
                 {{"format", "pt"},
                  {"source", "gpt-train"},
                  {"iteration", std::to_string(src.meta.iteration)},
                  {"n_layer", std::to_string(m.num_layers)},
                  {"n_embd", std::to_string(m.hidden)},
                  {"n_head", std::to_string(m.heads)},
                  {"n_inner", std::to_string(m.ffn)},
                  {"n_positions", std::to_string(m.seq_length)},
                  {"vocab_size", std::to_string(V)},
                  {"layer_norm_epsilon", fmt::format("{}", src.cfg.model.layernorm_eps)}},
                 safetensors_file);
}

void import_hf_gpt2(const std::string& safetensors_file, const Config& cfg, const std::string& checkpoint_dir) {
  const ModelDescription m = model_description_from_config(cfg);
  refuse_non_gpt2(m, "config " + cfg.source);
  SafetensorsReader in(safetensors_file);
  // Files name the tensors with or without "transformer."; the causal-mask buffers of older exports and
  // the tied head carry no weights of their own.
  auto hf_name = [](const std::string& stored) -> std::string {
    const std::string name = stored.starts_with("transformer.") || stored == "lm_head.weight" ? stored
                                                                                              : "transformer." + stored;
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name == "lm_head.weight") return "";
    return name;
  };
  import_tensors(in, hf_gpt2_names(m.num_layers, m.vocab_size), cfg, hf_name, "the config (" + cfg.source + ")",
                 fmt::format("a GPT-2 model with {} layers", m.num_layers), checkpoint_dir);
}

int convert_main(const ConvertOptions& args) {
  try {
    if (args.from.ends_with(".safetensors")) {
      Config cfg = load_config(args.config, args.sets);
      import_hf_gpt2(args.from, cfg, args.to);
      std::cout << "imported " << args.from << " into checkpoint " << args.to << "/" << iteration_dir_name(0) << "\n";
    } else if (args.to.ends_with(".safetensors")) {
      export_hf_gpt2(args.from, args.to);
      std::cout << "exported checkpoint " << args.from << " to " << args.to << " (Hugging Face GPT-2 names, F32)\n";
    } else if (fs::exists(fs::path(args.from) / "config.json")) {
      const Config cfg = config_from_hf_llama(args.from + "/config.json", args.config, args.sets);
      import_hf_llama(args.from, cfg, args.to);
      std::cout << "imported Hugging Face Llama " << args.from << " into checkpoint " << args.to << "/"
                << iteration_dir_name(0) << "\n";
    } else {
      export_hf_llama(args.from, args.to);
      std::cout << "exported checkpoint " << args.from << " to " << args.to
                << " (Hugging Face LlamaForCausalLM: config.json, model.safetensors, F32)\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt-train convert: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace gpt
