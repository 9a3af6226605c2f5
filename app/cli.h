// Command-line parsing for gpt-train, by hand: `gpt-train [SUBCOMMAND] [--config FILE] [--set k=v ...]
// [--name value | --name=value | --flag ...] [positional ...]`. The subcommand defaults to `train` when the
// first argument is an option; `--set` may repeat and keeps its order; other options land in a map that
// the subcommand reads with get / get_int / has and can check against the options it knows.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

// Bad command line; the message says what is wrong and points at --help.
struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Subcommand {
  const char* name;
  const char* summary;  // one line for --help
};
// train, eval, prep, schedule, config, plan.
const std::vector<Subcommand>& subcommands();

struct ParsedArgs {
  std::string command;                 // a name from subcommands(); "" when no arguments were given
  std::string config;                  // --config FILE; "" when absent
  std::vector<std::string> sets;       // every --set key.path=value, in order
  std::vector<std::string> positional;  // arguments that are not options (and everything after "--")
  std::map<std::string, std::vector<std::string>> options;  // other --name values ("" for a bare flag)
  bool help = false;                   // --help, -h or `gpt-train help`

  bool has(const std::string& name) const;
  // The last value given for --name, or `fallback` when absent.
  std::string get(const std::string& name, const std::string& fallback = "") const;
  // Typed reads; a value that is not of the type throws CliError naming the option.
  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_double(const std::string& name, double fallback) const;
  // A bare --name is true; a value must be true/false/yes/no/on/off/1/0.
  bool get_bool(const std::string& name, bool fallback) const;
  // Every value given for --name, in order.
  std::vector<std::string> get_all(const std::string& name) const;
  // Throws CliError for any option not in `allowed` (names without "--"); --config, --set and --help
  // are always allowed.
  void check_options(const std::vector<std::string>& allowed) const;
};

// A bare `--name` takes the next argument as its value unless that argument starts with "--" or `name`
// is a flag that never takes a value (help, dump, version, random-init). Use --name=value to be explicit.
// Throws CliError for an unknown subcommand, a --config or --set without a value, or a --set that is
// not key=value.
ParsedArgs parse_args(int argc, char** argv);
// Same for the arguments after the program name.
ParsedArgs parse_args(const std::vector<std::string>& args);

// The --help text: usage, every subcommand with its summary, the common options.
std::string usage_text(const std::string& program = "gpt-train");

}  // namespace gpt
