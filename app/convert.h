// `gpt-train convert`: exchange weights with other tools through one safetensors file in the Hugging Face
// GPT-2 layout (transformer.wte.weight, transformer.h.{i}.attn.c_attn.weight, ...; Conv1D weights are
// [in, out], i.e. ours transposed; the padded vocabulary rows are dropped). Export reads the global fp32
// weights (master copies where the checkpoint has them) of a checkpoint saved in any layout; import
// writes a checkpoint (iteration 0, weights only: the optimizer starts fresh) that any layout can load.
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

// The options of `gpt-train convert` (defined on the command line in app/cli_subcommands.cpp): --from
// CHECKPOINT --to FILE.safetensors, or --from FILE.safetensors --to DIR --config FILE [--set ...].
struct ConvertOptions {
  std::string from, to;
  std::string config;             // import: the model architecture
  std::vector<std::string> sets;
};

// Exit status 0, or 1 with the message on stderr.
int convert_main(const ConvertOptions& options);

}  // namespace gpt
