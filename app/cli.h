// The command line of gpt-train: `gpt-train [SUBCOMMAND] [options]`, parsed with CLI11 into the typed
// options struct of one subcommand (TrainOptions, PrepOptions, ...). Each subcommand's flags are defined
// once, in app/cli_subcommands.cpp; every subcommand has its own --help, and `gpt-train --help` lists
// them. The subcommand defaults to `train` when the first argument is an option. Options are spelled
// --name VALUE or --name=VALUE; --set may repeat and keeps its order.
#pragma once
#include <any>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

// Bad command line (exit status 2); the message says what is wrong and where to find the usage.
struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Subcommand {
  std::string name;
  std::string summary;  // one line for `gpt-train --help`
};
// Every subcommand, in the order `gpt-train --help` lists them.
std::vector<Subcommand> subcommands();

// What the command line asks for.
struct CommandLine {
  std::string command;    // a name from subcommands(); "" when none was given
  bool help = false;      // --help, -h or `gpt-train help [SUBCOMMAND]`: print help_text and exit 0
  std::string help_text;  // the subcommand's own help, or the overview without one
  bool under_mpi = false; // the subcommand runs after MPI_Init (train, eval)
  std::any options;       // the subcommand's options struct; empty when help or no subcommand

  // The options as their struct; throws std::bad_any_cast for another subcommand's type.
  template <class Options>
  const Options& get() const {
    return std::any_cast<const Options&>(options);
  }
  // Runs the subcommand on its options and returns its exit status.
  int run() const { return runner(options); }

  std::function<int(const std::any&)> runner;
};

// Throws CliError for an unknown subcommand (with a suggestion), an option the subcommand does not know
// (naming the subcommand), a value of the wrong type, or a combination the subcommand refuses.
CommandLine parse_command_line(const std::vector<std::string>& args);  // the words after the program name
CommandLine parse_command_line(int argc, char** argv);

// The overview: every subcommand with its summary and the options shared by those that read a config.
std::string usage_text();

}  // namespace gpt
