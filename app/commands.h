// The subcommands train, eval, schedule and config: their options (filled from the command line by
// app/cli_subcommands.cpp) and the functions that run them, each returning the exit status.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

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

struct TrainOptions {
  std::string config;             // --config FILE
  std::vector<std::string> sets;  // --set key.path=value, in order
  std::string load;               // --load DIR: checkpoint.load
};

struct EvalOptions {
  std::string config;  // "" with --load: the checkpoint's own config
  std::vector<std::string> sets;
  std::string load;               // --load DIR: the checkpoint to evaluate
  std::optional<int64_t> iters;   // batches per split; 0 = each split once through; absent = eval.iters
  bool random_init = false;       // evaluate the initial weights of training.seed
};

struct ScheduleOptions {
  int64_t pp = 1, vpp = 1, microbatches = 1;
  int64_t cp = 1;  // > 1: also the context-parallel chunk assignment and ring steps
};

struct ConfigCommandOptions {
  std::string config;  // "" = the defaults
  std::vector<std::string> sets;
  bool dump = false;  // accepted for clarity: the effective config is always printed
};

// Run under MPI_Init, on every rank.
int train_main(const TrainOptions& options);
int eval_main(const EvalOptions& options);
// No MPI.
int schedule_main(const ScheduleOptions& options);  // print pipeline schedule tables
int config_main(const ConfigCommandOptions& options);  // print the effective config

}  // namespace gpt
