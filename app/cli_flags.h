// How subcommands are declared on CLI11. Flags wraps a subcommand's CLI::App with typed adders that read
// and check each value themselves (so a bad one reads "--iters expects an integer, got 'two'"), the
// --config / --set pair of the subcommands that read a config, and rules on the parsed values that run
// after unknown options have been refused. SubcommandTable holds every subcommand: its flags bound to a
// fresh options struct and the function that runs it. Only app/cli*.cpp include this header, so CLI11
// stays out of the rest of the code.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <any>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpt {

class Flags {
 public:
  explicit Flags(CLI::App& app) : app_(app) {}
  CLI::App& app() { return app_; }

  // --name VALUE. `value_name` is how --help shows the value (FILE, P, KIND).
  CLI::Option* text(const std::string& name, std::string& target, const std::string& value_name,
                    const std::string& help);
  // --name VALUE, left unset when absent (an empty VALUE is a value).
  CLI::Option* text(const std::string& name, std::optional<std::string>& target, const std::string& value_name,
                    const std::string& help);
  // --name V1 V2 ... (the values up to the next option), repeatable; every value in order.
  CLI::Option* texts(const std::string& name, std::vector<std::string>& target, const std::string& value_name,
                     const std::string& help);
  // --name VALUE where VALUE is one of `choices`.
  CLI::Option* choice(const std::string& name, std::string& target, const std::vector<std::string>& choices,
                      const std::string& help);
  CLI::Option* integer(const std::string& name, int64_t& target, const std::string& help);
  CLI::Option* integer(const std::string& name, int& target, const std::string& help);
  CLI::Option* integer(const std::string& name, std::optional<int64_t>& target, const std::string& help);
  CLI::Option* integer(const std::string& name, uint64_t& target, const std::string& help);  // >= 0 (seeds)
  CLI::Option* number(const std::string& name, double& target, const std::string& help);
  // --name, or --name=true|false (also yes/no, on/off, 1/0).
  CLI::Option* flag(const std::string& name, bool& target, const std::string& help);
  // --config FILE and --set key.path=value (repeatable, applied in order after the file).
  void config(std::string& file, std::vector<std::string>& sets);

  // A rule on the parsed values; it throws CliError to refuse the command line.
  void check(std::function<void()> rule) { checks_.push_back(std::move(rule)); }
  const std::vector<std::function<void()>>& checks() const { return checks_; }

 private:
  // An option whose text `store` checks and keeps (throwing CLI::ValidationError with the message).
  CLI::Option* add(const std::string& name, const std::string& value_name, const std::string& help,
                   std::function<void(const std::string&)> store);

  CLI::App& app_;
  std::vector<std::function<void()>> checks_;
};

// Every subcommand of gpt-train (filled by define_subcommands, app/cli_subcommands.cpp).
class SubcommandTable {
 public:
  enum class Runs { BeforeMpi, UnderMpi };

  explicit SubcommandTable(CLI::App& app) : app_(app) {}

  // Subcommand `name`: `define` declares its flags into an Options struct; `run` runs it on the parsed
  // options and returns the exit status, before MPI_Init or after it (on every rank).
  template <class Options>
  void add(const std::string& name, const std::string& summary, Runs runs, void (*define)(Flags&, Options&),
           int (*run)(const Options&)) {
    Entry e;
    e.app = app_.add_subcommand(name, summary);
    e.app->allow_extras();  // unknown options are reported by the parser, naming the subcommand
    e.flags = std::make_shared<Flags>(*e.app);
    auto options = std::make_shared<Options>();
    define(*e.flags, *options);
    e.under_mpi = runs == Runs::UnderMpi;
    e.options = [options] { return std::any(*options); };
    e.run = [run](const std::any& parsed) { return run(std::any_cast<const Options&>(parsed)); };
    entries_.push_back(std::move(e));
  }

  struct Entry {
    CLI::App* app = nullptr;
    std::shared_ptr<Flags> flags;
    bool under_mpi = false;
    std::function<std::any()> options;  // a copy of the options as parsed so far
    std::function<int(const std::any&)> run;
  };
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  CLI::App& app_;
  std::vector<Entry> entries_;
};

// Adds every subcommand to `table`.
void define_subcommands(SubcommandTable& table);

// The --help layout of every subcommand: descriptions wrapped beside the option column, defaults shown
// as "(default: X)".
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter();
  std::string make_usage(const CLI::App* app, std::string name) const override;
  std::string make_option_opts(const CLI::Option* opt) const override;
  std::string make_option_desc(const CLI::Option* opt) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
  std::string make_footer(const CLI::App* app) const override;
};

}  // namespace gpt
