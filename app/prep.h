// `gpt-train prep`: turns text (plain files or JSON lines) into tokenized HDF5 shards for training, or
// converts a Megatron-LM indexed dataset (already tokenized) into the same shards.
#pragma once

namespace gpt {

struct PrepOptions;

// Runs the pipeline on checked options (app/cli_subcommands.cpp defines the flags) with a progress line
// on stderr and prints a summary on stdout. Returns 0 on success, 1 on a data error (message on stderr
// naming the file).
int prep_main(const PrepOptions& options);

}  // namespace gpt
