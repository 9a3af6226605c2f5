// `gpt-train prep`: turns text (plain files or JSON lines) into tokenized HDF5 shards for training, or
// converts a Megatron-LM indexed dataset (already tokenized) into the same shards.
#pragma once
#include <string>
#include <vector>

namespace gpt {

// `args` are the command-line words after "prep". Parses its own options (see prep_usage()), runs the
// pipeline with a progress line on stderr and prints a summary on stdout. Returns 0 on success, 1 on a
// data error (message on stderr naming the file), 2 on a bad command line.
int prep_main(const std::vector<std::string>& args);

std::string prep_usage();

}  // namespace gpt
