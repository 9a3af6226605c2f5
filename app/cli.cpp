// parse_command_line: the words a user typed, through CLI11 and the subcommand table, into one
// subcommand's options. Done here, around CLI11: `help [SUBCOMMAND]`, the train default, the unknown
// subcommand message (a close match suggested, or the train command for a YAML file), unknown options named
// with their subcommand, and every error ending with where to find the usage. Config knowledge stays out:
// --set values are only checked for the key=value shape; the config loader types and checks them.
#include "app/cli.h"

#include <algorithm>
#include <memory>
#include <regex>

#include <fmt/format.h>

#include "app/cli_flags.h"
#include "app/config_schema.h"

namespace gpt {

namespace {

constexpr const char* kOverview = "gpt-train: train GPT models with tensor, pipeline and data parallelism";

constexpr const char* kCommonOptions =
    "Options of the subcommands that read a config (train, eval, config, plan, convert):\n"
    "  --config FILE          YAML config (configs/tiny-cpu.yaml is a small demo)\n"
    "  --set key.path=value   override one config key, typed as in the YAML, e.g. --set model.num_layers=4\n"
    "                         or --set data.train=[a,b]; may repeat, applied in order\n"
    "\n"
    "'gpt-train SUBCOMMAND --help' lists a subcommand's options. Without a subcommand, gpt-train trains: "
    "'gpt-train --config FILE' is 'gpt-train train --config FILE'. 'gpt-train config --config FILE --dump' "
    "prints every config key with its value.";

// The CLI11 application with every subcommand; `table` keeps the subcommands' options.
std::unique_ptr<CLI::App> make_app(std::unique_ptr<SubcommandTable>& table) {
  auto app = std::make_unique<CLI::App>(kOverview, "gpt-train");
  app->formatter(std::make_shared<HelpFormatter>());
  app->require_subcommand(0, 1);  // at most one; later words equal to a subcommand name are values
  table = std::make_unique<SubcommandTable>(*app);
  define_subcommands(*table);
  app->footer(kCommonOptions);  // after the subcommands, which would inherit it
  return app;
}

std::string unknown_subcommand_message(const std::string& name) {
  std::string message = fmt::format("unknown subcommand '{}'", name);
  if (name.size() > 5 && (name.ends_with(".yaml") || name.ends_with(".yml")))
    return message + fmt::format("; to train with this config run 'gpt-train train --config {}'", name);
  std::string best;
  size_t best_distance = 3;  // suggest only close matches
  std::string known;
  for (const Subcommand& s : subcommands()) {
    known += (known.empty() ? "" : ", ") + s.name;
    size_t d = edit_distance(name, s.name);
    if (d < best_distance) {
      best_distance = d;
      best = s.name;
    }
  }
  if (!best.empty()) message += fmt::format(" (did you mean '{}'?)", best);
  return message + "; known: " + known + " (run 'gpt-train --help' for usage)";
}

// The words left over after parsing `sub` (CLI11 keeps them: extras are allowed) as an error.
void refuse_extras(const CLI::App& sub) {
  const std::vector<std::string> extras = sub.remaining();
  if (extras.empty()) return;
  auto option =
      std::find_if(extras.begin(), extras.end(), [](const std::string& w) { return w.size() > 1 && w[0] == '-'; });
  if (option == extras.end())
    throw CliError(
        fmt::format("unexpected argument '{}' for '{}' (it takes only options)", extras.front(), sub.get_name()));
  std::string known;
  for (const CLI::Option* o : sub.get_options())
    if (!o->get_lnames().empty() && o->get_lnames().front() != "help") known += " --" + o->get_lnames().front();
  const std::string name = option->substr(0, option->find('='));
  throw CliError(fmt::format("unknown option {} for '{}'; known:{}", name, sub.get_name(), known));
}

// A bare --name that needs a value takes the next word only when that word is not itself an option
// ("--config --set a=1" lacks the file; a value starting with "--" is written --name=VALUE). CLI11 would
// take the next word whatever it is, so this is checked first.
void refuse_missing_values(const CLI::App& sub, const std::vector<std::string>& words) {
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w == "--") return;
    if (w.size() < 3 || w.compare(0, 2, "--") != 0 || w.find('=') != std::string::npos) continue;
    const CLI::Option* o = sub.get_option_no_throw(w);
    if (!o || o->get_expected_min() < 1) continue;
    if (i + 1 == words.size() || words[i + 1].compare(0, 2, "--") == 0)
      throw CliError(w + " needs " + o->get_type_name());
  }
}

// A CLI11 error in the words this project uses: "--config needs FILE" for a missing value.
std::string describe(const CLI::ParseError& e) {
  static const std::regex missing_value(R"(^(--[\w-]+): \d+ required (.+) missing$)");
  std::smatch m;
  const std::string what = e.what();
  if (std::regex_match(what, m, missing_value)) return m[1].str() + " needs " + m[2].str();
  return what;
}

std::string usage_hint(const std::string& command) {
  return fmt::format(" (see 'gpt-train {}--help')", command.empty() ? "" : command + " ");
}

}  // namespace

std::vector<Subcommand> subcommands() {
  std::unique_ptr<SubcommandTable> table;
  auto app = make_app(table);
  std::vector<Subcommand> out;
  for (const SubcommandTable::Entry& e : table->entries())
    out.push_back({e.app->get_name(), e.app->get_description()});
  return out;
}

std::string usage_text() {
  std::unique_ptr<SubcommandTable> table;
  return make_app(table)->help();
}

CommandLine parse_command_line(int argc, char** argv) {
  return parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
}

CommandLine parse_command_line(const std::vector<std::string>& given) {
  std::vector<std::string> args = given;
  if (!args.empty() && args[0] == "help")  // `help` and `help SUBCOMMAND`
    args = args.size() > 1 ? std::vector<std::string>{args[1], "--help"} : std::vector<std::string>{"--help"};
  std::unique_ptr<SubcommandTable> table;
  auto app = make_app(table);
  const auto& entries = table->entries();
  if (!args.empty()) {
    const std::string& first = args[0];
    const bool known = std::any_of(entries.begin(), entries.end(),
                                   [&](const SubcommandTable::Entry& e) { return e.app->get_name() == first; });
    if (!first.empty() && first[0] == '-') {
      if (first != "--help" && first != "-h") args.insert(args.begin(), "train");  // gpt-train --config FILE
    } else if (!known) {
      throw CliError(unknown_subcommand_message(first));
    }
  }

  CommandLine out;
  const SubcommandTable::Entry* chosen = nullptr;
  auto chosen_name = [&] { return chosen ? chosen->app->get_name() : std::string(); };
  try {
    for (const auto& e : entries)
      if (!args.empty() && e.app->get_name() == args[0]) {
        chosen = &e;
        const bool help =
            std::any_of(args.begin(), args.end(), [](const std::string& w) { return w == "--help" || w == "-h"; });
        if (!help) refuse_missing_values(*e.app, std::vector<std::string>(args.begin() + 1, args.end()));
      }
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes the words last first
    try {
      app->parse(reversed);
    } catch (const CLI::ParseError&) {
      for (const auto& e : entries)
        if (e.app->parsed()) chosen = &e;
      throw;
    }
    for (const auto& e : entries)
      if (e.app->parsed()) chosen = &e;
    if (!chosen) {  // no words at all
      out.help_text = app->help();
      return out;
    }
    refuse_extras(*chosen->app);
    for (const auto& check : chosen->flags->checks()) check();
  } catch (const CLI::CallForHelp&) {
    out.command = chosen_name();
    out.help = true;
    out.help_text = app->help();  // the chosen subcommand's, or the overview
    return out;
  } catch (const CLI::ParseError& e) {
    throw CliError(describe(e) + usage_hint(chosen_name()));
  } catch (const CliError& e) {
    throw CliError(e.what() + usage_hint(chosen_name()));
  }
  out.command = chosen_name();
  out.under_mpi = chosen->under_mpi;
  out.options = chosen->options();
  out.runner = chosen->run;
  return out;
}

}  // namespace gpt
