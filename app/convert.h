// `gpt-train convert`: exchange weights with Hugging Face transformers through safetensors. Two layouts:
//  - GPT-2 (GPT2LMHeadModel): one file, transformer.wte.weight, transformer.h.{i}.attn.c_attn.weight, ...;
//    Conv1D weights are [in, out], i.e. ours transposed. The model must be the default GPT-2 variant, and
//    an import takes the architecture from a gpt-train config.
//  - Llama (LlamaForCausalLM): a directory with config.json and model.safetensors (an import also reads
//    the shards of a model.safetensors.index.json); the fused q|k|v and gate|up weights are split into
//    q_proj/k_proj/v_proj and gate_proj/up_proj. The model must be rope (every dim rotating), RMSNorm,
//    SwiGLU, no linear biases; any query groups, tied or untied. Our rotary embedding rotates the two
//    halves of each head (rotate_half, as HF's LlamaRotaryEmbedding), so q and k rows are copied as they
//    are: no permutation either way.
// The padded vocabulary rows are dropped on export. Export reads the global fp32 weights (master copies
// where the checkpoint has them) of a checkpoint saved in any layout and writes F32; import reads F32, F16
// or BF16 and writes a checkpoint (iteration 0, weights only: the optimizer starts fresh) that any layout
// can load.
#pragma once
#include <string>
#include <vector>

#include "app/config.h"

namespace gpt {

// Checkpoint (an iteration directory, or a directory with `latest`) -> safetensors file.
void export_hf_gpt2(const std::string& checkpoint, const std::string& safetensors_file);
// safetensors file -> checkpoint directory `checkpoint_dir` (iter_0000000 + latest). `cfg` gives the
// architecture (heads, eps, ...) and is stored as the checkpoint's config; the file's shapes must match it.
void import_hf_gpt2(const std::string& safetensors_file, const Config& cfg, const std::string& checkpoint_dir);

// Checkpoint -> directory `hf_dir` (created) holding config.json and model.safetensors.
void export_hf_llama(const std::string& checkpoint, const std::string& hf_dir);
// The config of an imported Llama: `base_config` (a gpt-train config file; empty: the defaults) with the
// model.* keys that the Hugging Face config.json at `config_json` fixes, then `sets` ("key=value").
// Throws naming the config.json key when the file is not a Llama that gpt-train can express.
Config config_from_hf_llama(const std::string& config_json, const std::string& base_config,
                            const std::vector<std::string>& sets);
// Directory `hf_dir` (model.safetensors, or model.safetensors.index.json and its shards) -> checkpoint
// directory `checkpoint_dir`, for the model `cfg` (from config_from_hf_llama) describes.
void import_hf_llama(const std::string& hf_dir, const Config& cfg, const std::string& checkpoint_dir);

// The options of `gpt-train convert` (defined on the command line in app/cli_subcommands.cpp):
//   --from CHECKPOINT --to FILE.safetensors               GPT-2 export
//   --from FILE.safetensors --to DIR --config FILE        GPT-2 import
//   --from CHECKPOINT --to HF_DIR                         Llama export
//   --from HF_DIR --to DIR [--config FILE]                Llama import (HF_DIR holds config.json)
// with --set overrides after the config.
struct ConvertOptions {
  std::string from, to;
  std::string config;  // import: the model architecture (GPT-2), or the run's other keys (Llama)
  std::vector<std::string> sets;
};

// Exit status 0, or 1 with the message on stderr.
int convert_main(const ConvertOptions& options);

}  // namespace gpt
