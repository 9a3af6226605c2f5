// The subcommands of gpt-train, each a function of the parsed command line returning the exit status.
#pragma once
#include <stdexcept>

#include "app/cli.h"

namespace gpt {

// An error that every rank raises identically at start-up (config, layout): printed once, exit 1.
struct StartupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int schedule_main(const ParsedArgs& args);  // print pipeline schedule tables (no MPI)
int config_main(const ParsedArgs& args);    // --dump the effective config (no MPI)
// train and eval, under MPI_Init.
int run_distributed_command(const ParsedArgs& args);

}  // namespace gpt
