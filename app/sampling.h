// Choosing the next token from a model's logits, as `gpt-train generate` does: greedy (temperature 0),
// or sampling from softmax(logits / temperature) restricted to the top-k tokens and then to the smallest
// set whose probability reaches top-p (nucleus sampling). Pure functions of the logits and a seeded
// generator, so a seed reproduces its samples.
#pragma once
#include <cstdint>
#include <random>
#include <span>

namespace gpt {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: every token
  double top_p = 1.0;        // 1: no nucleus cut
};

// Throws std::invalid_argument naming the flag when an option is out of range (temperature < 0 or not
// finite, top_k < 0, top_p outside (0, 1]).
void check_sampling_options(const SamplingOptions& o);

// The index of the largest logit (the first on ties).
int32_t argmax_token(std::span<const float> logits);

// The next token from `logits` (the real vocabulary only; padding columns cut off by the caller).
// Non-finite logits are treated as impossible tokens; throws std::runtime_error when none is finite.
int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng);

}  // namespace gpt
