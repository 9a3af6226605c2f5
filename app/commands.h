// The subcommands of gpt-train, each a function of the parsed command line returning the exit status.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

#include "app/cli.h"
#include "app/config.h"

namespace gpt {

// An error that every rank raises identically at start-up (config, layout): printed once, exit 1.
struct StartupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The config a checkpoint was saved with (its metadata.yaml keeps the saving run's whole config: model,
// tokenizer, data) on a layout that fits any world size: tensor, pipeline and virtual pipeline 1, data
// parallel over every rank, no checkpoint saving; `sets` applied last. Throws StartupError.
Config config_of_checkpoint(const std::string& load, const std::vector<std::string>& sets);

int schedule_main(const ParsedArgs& args);  // print pipeline schedule tables (no MPI)
int config_main(const ParsedArgs& args);    // --dump the effective config (no MPI)
// train and eval, under MPI_Init.
int run_distributed_command(const ParsedArgs& args);

}  // namespace gpt
