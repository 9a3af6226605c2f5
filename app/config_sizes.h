// Checks that every size the program derives from a config fits the integer it is computed in: the
// padded vocabulary, the MLP width, parameter counts and their bytes, a bound on a step's activation
// bytes, tokens per step and per run, the gradient bucket bytes, and the counts that are held in an
// `int` (layers, parallel sizes and the world they multiply to, microbatches per step, threads). Part of
// validate_config, so an absurd value stops at start-up with a ConfigError that names the keys whose
// product is too large, never later with a wrapped, negative size deep in the model.
#pragma once

namespace gpt {

struct Config;

// Throws ConfigError ("config FILE: ... key = value ...") for the first derived size that overflows.
// Expects the per-key range checks of validate_config to have passed (sizes >= 1, or >= 0 where allowed).
void check_derived_sizes(const Config& c);

}  // namespace gpt
