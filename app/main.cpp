// gpt-train entry point: parses the command line (app/cli.h), runs a subcommand that needs no MPI at once,
// or starts MPI and runs one that does (train, eval, generate).
// Start-up errors that every rank hits alike (config, layout) are printed once by rank 0 and every rank
// exits 1; an error on one rank later on aborts the whole job with a message naming that rank, so no
// rank is left waiting in a collective.
#include <mpi.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <iostream>

#include "app/cli.h"
#include "app/commands.h"

namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

int main(int argc, char** argv) {
  gpt::CommandLine command;
  try {
    command = gpt::parse_command_line(argc, argv);
  } catch (const gpt::CliError& e) {
    std::fprintf(stderr, "gpt-train: %s\n", e.what());
    return 2;
  }
  if (command.help || command.command.empty()) {
    std::cout << command.help_text;
    return command.help ? 0 : 2;
  }
  // Subcommands that need no MPI run before MPI_Init so they work without a launcher; each reports its
  // own errors.
  if (!command.under_mpi) {
    try {
      return command.run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpt-train %s: error: %s\n", command.command.c_str(), e.what());
      return 1;
    }
  }

  // Threads: the watchdog's census talks MPI from its own thread while the main thread may be blocked in
  // a collective. Without MPI_THREAD_MULTIPLE the watchdog still works, without the census.
  // GPT_TRAIN_MPI_THREADS=funneled asks for less, for MPI stacks that slow down under MPI_THREAD_MULTIPLE.
  const char* threads = std::getenv("GPT_TRAIN_MPI_THREADS");
  const bool funneled = threads && std::string(threads) == "funneled";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, funneled ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE, &provided);
  const int rank = world_rank();
  int rc = 0;
  try {
    rc = command.run();
  } catch (const gpt::StartupError& e) {
    // Every rank threw the same error from the same inputs.
    if (rank == 0) std::fprintf(stderr, "gpt-train: error: %s\n", e.what());
    rc = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt-train: [rank %d] error: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
