// gpt-train entry point: parses the command line, starts MPI, and dispatches to a subcommand.
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
#include "app/config.h"
#include "app/convert.h"
#include "app/generate.h"
#include "app/plan.h"
#include "app/prep.h"

namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

int main(int argc, char** argv) {
  gpt::ParsedArgs args;
  try {
    args = gpt::parse_args(argc, argv);
  } catch (const gpt::CliError& e) {
    std::fprintf(stderr, "gpt-train: %s\n", e.what());
    return 2;
  }
  if (args.help || args.command.empty()) {
    std::cout << gpt::usage_text();
    return args.help ? 0 : 2;
  }
  // Subcommands that need no MPI run before MPI_Init so they work without a launcher.
  try {
    if (args.command == "schedule") return gpt::schedule_main(args);
    if (args.command == "plan") return gpt::plan_main(args);
    if (args.command == "config") return gpt::config_main(args);
    if (args.command == "convert") return gpt::convert_main(args);
    if (args.command == "prep") return gpt::prep_main(std::vector<std::string>(argv + 2, argv + argc));
  } catch (const gpt::CliError& e) {  // an option the subcommand does not know
    std::fprintf(stderr, "gpt-train: %s\n", e.what());
    return 2;
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
    if (args.command == "generate") {
      args.check_options({"load", "prompt", "prompt-file", "max-new-tokens", "temperature", "top-k", "top-p", "seed",
                          "num-samples", "backend", "tokenizer", "vocab-file", "merges-file"});
      gpt::GenerateOptions o;
      o.load = args.get("load");
      o.config = args.config;
      o.sets = args.sets;
      o.prompt_given = args.has("prompt");
      o.prompt = args.get("prompt");
      o.prompt_file = args.get("prompt-file");
      o.max_new_tokens = args.get_int("max-new-tokens", o.max_new_tokens);
      o.temperature = args.get_double("temperature", o.temperature);
      o.top_k = args.get_int("top-k", o.top_k);
      o.top_p = args.get_double("top-p", o.top_p);
      o.seed = static_cast<uint64_t>(args.get_int("seed", static_cast<int64_t>(o.seed)));
      o.num_samples = args.get_int("num-samples", o.num_samples);
      o.backend = args.get("backend");
      o.tokenizer = args.get("tokenizer");
      o.vocab_file = args.get("vocab-file");
      o.merges_file = args.get("merges-file");
      rc = gpt::generate_main(o);
    } else {
      rc = gpt::run_distributed_command(args);
    }
  } catch (const gpt::StartupError& e) {
    // Every rank threw the same error from the same inputs.
    if (rank == 0) std::fprintf(stderr, "gpt-train: error: %s\n", e.what());
    rc = 1;
  } catch (const gpt::CliError& e) {  // likewise: an option this subcommand does not know
    if (rank == 0) std::fprintf(stderr, "gpt-train: %s\n", e.what());
    rc = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt-train: [rank %d] error: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
