// `gpt-train generate`: samples text from a checkpoint on one rank. The checkpoint is loaded at tensor,
// pipeline and data parallel size 1 whatever layout saved it (resharded on load), on the CPU or CUDA
// backend, and decoded with a key/value cache so each new token costs time linear in the context. The
// tokenizer comes from the checkpoint's own record (or from flags, for checkpoints without one).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct GenerateOptions {
  std::string load;                // checkpoint directory (or its parent with a `latest` pointer)
  std::string config;              // optional: a config to use instead of the checkpoint's own
  std::vector<std::string> sets;   // --set key.path=value overrides, applied last
  std::string prompt;              // --prompt TEXT
  std::string prompt_file;         // --prompt-file F (exclusive with --prompt)
  bool prompt_given = false;       // --prompt was given (an empty --prompt "" is an error)
  int64_t max_new_tokens = 64;
  double temperature = 1.0;        // 0 = greedy (argmax)
  int64_t top_k = 0;               // 0 = no top-k filter
  double top_p = 1.0;              // nucleus sampling mass; 1 = off
  uint64_t seed = 1234;
  int64_t num_samples = 1;
  std::string backend;             // cpu | cuda; "" = the checkpoint's training.backend
  // Tokenizer for checkpoints that do not record theirs: bytes | gpt2 | spm and its files.
  std::string tokenizer, vocab_file, merges_file;
};

// Runs under MPI_Init on a world of one rank; returns the exit status (0 ok). Errors throw
// std::runtime_error with a message naming the file, flag or token at fault.
int generate_main(const GenerateOptions& options);

}  // namespace gpt
