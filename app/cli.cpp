// The hand-written argv parser behind app/cli.h and the --help text. Kept free of config knowledge:
// --set values are only checked for the key=value shape here; the config loader types and checks them.
#include "app/cli.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include <fmt/format.h>

#include "app/config_schema.h"

namespace gpt {
namespace {

// Options that are switches; they never consume the next argument.
const std::set<std::string> kFlags = {"help", "dump", "version", "random-init"};

bool is_subcommand(const std::string& name) {
  return std::any_of(subcommands().begin(), subcommands().end(),
                     [&](const Subcommand& s) { return name == s.name; });
}

[[noreturn]] void fail(const std::string& what) {
  throw CliError(what + " (run 'gpt-train --help' for usage)");
}

std::string unknown_subcommand_message(const std::string& name) {
  std::string message = fmt::format("unknown subcommand '{}'", name);
  if (name.size() > 5 && (name.ends_with(".yaml") || name.ends_with(".yml")))
    return message + fmt::format("; to train with this config run 'gpt-train train --config {}'", name);
  std::string best;
  size_t best_distance = 3;  // suggest only close matches
  std::string known;
  for (const Subcommand& s : subcommands()) {
    known += (known.empty() ? "" : ", ") + std::string(s.name);
    size_t d = edit_distance(name, s.name);
    if (d < best_distance) {
      best_distance = d;
      best = s.name;
    }
  }
  if (!best.empty()) message += fmt::format(" (did you mean '{}'?)", best);
  return message + "; known: " + known;
}

}  // namespace

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> list = {
      {"train", "train a model from a config (the default when the first argument is an option)"},
      {"eval", "validation loss of a checkpoint (--load DIR; its own config unless --config), or of the initial "
               "weights (--random-init)"},
      {"prep", "tokenize text files into HDF5 token shards"},
      {"schedule", "print the pipeline schedule table for given pipeline, virtual and microbatch sizes"},
      {"config", "load and validate a config; --dump prints every key with its value"},
      {"plan", "rank parallel layouts for a config on N GPUs by predicted step time and memory (--gpus N)"},
      {"convert", "export a checkpoint to Hugging Face GPT-2 safetensors, or import one"},
      {"generate", "sample text from a checkpoint on one rank (--load DIR [--prompt TEXT] [--max-new-tokens N] "
                   "[--temperature T] [--top-k K] [--top-p P] [--seed S] [--num-samples N])"},
  };
  return list;
}

ParsedArgs parse_args(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_args(args);
}

ParsedArgs parse_args(const std::vector<std::string>& args) {
  ParsedArgs parsed;
  size_t i = 0;
  if (!args.empty()) {
    const std::string& first = args[0];
    if (first == "help") {
      parsed.help = true;
      i = 1;
    } else if (first == "--help" || first == "-h") {
      // Plain `gpt-train --help` asks for the overview, not for train's help; the loop records it.
    } else if (!first.empty() && first[0] == '-') {
      parsed.command = "train";
    } else if (is_subcommand(first)) {
      parsed.command = first;
      i = 1;
    } else {
      fail(unknown_subcommand_message(first));
    }
  }

  bool config_given = false;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      parsed.positional.insert(parsed.positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg == "-h") {
      parsed.help = true;
      continue;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      // "-x" is not an option syntax here; a lone "-" or a negative number is a positional argument.
      bool negative_number = arg.size() > 1 && arg[0] == '-' && (std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.');
      if (arg.size() > 1 && arg[0] == '-' && !negative_number)
        fail(fmt::format("unknown option '{}' (options are spelled --name)", arg));
      parsed.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    } else if (!kFlags.count(name) && i + 1 < args.size() && args[i + 1].compare(0, 2, "--") != 0) {
      value = args[++i];
      has_value = true;
    }
    if (name.empty()) fail(fmt::format("malformed option '{}'", arg));

    if (name == "help") {
      parsed.help = true;
    } else if (name == "config") {
      if (!has_value || value.empty()) fail("--config needs a file name");
      if (config_given) fail(fmt::format("--config given twice ('{}' and '{}')", parsed.config, value));
      parsed.config = value;
      config_given = true;
    } else if (name == "set") {
      if (!has_value) fail("--set needs key.path=value");
      if (value.find('=') == std::string::npos || value[0] == '=')
        fail(fmt::format("--set '{}': expected key.path=value", value));
      parsed.sets.push_back(value);
    } else {
      parsed.options[name].push_back(value);
    }
  }
  return parsed;
}

bool ParsedArgs::has(const std::string& name) const { return options.count(name) > 0; }

std::string ParsedArgs::get(const std::string& name, const std::string& fallback) const {
  auto it = options.find(name);
  return it == options.end() ? fallback : it->second.back();
}

std::vector<std::string> ParsedArgs::get_all(const std::string& name) const {
  auto it = options.find(name);
  return it == options.end() ? std::vector<std::string>{} : it->second;
}

int64_t ParsedArgs::get_int(const std::string& name, int64_t fallback) const {
  if (!has(name)) return fallback;
  std::string text = get(name);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    fail(fmt::format("--{} expects an integer, got '{}'", name, text));
  return value;
}

double ParsedArgs::get_double(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  std::string text = get(name);
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    fail(fmt::format("--{} expects a number, got '{}'", name, text));
  return value;
}

bool ParsedArgs::get_bool(const std::string& name, bool fallback) const {
  if (!has(name)) return fallback;
  std::string text = get(name);
  if (text.empty() || text == "true" || text == "yes" || text == "on" || text == "1") return true;
  if (text == "false" || text == "no" || text == "off" || text == "0") return false;
  fail(fmt::format("--{} expects true or false, got '{}'", name, text));
}

void ParsedArgs::check_options(const std::vector<std::string>& allowed) const {
  for (const auto& [name, values] : options) {
    if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) continue;
    std::string known;
    for (const std::string& a : allowed) known += " --" + a;
    fail(fmt::format("unknown option --{} for '{}'{}", name, command.empty() ? "gpt-train" : command,
                     allowed.empty() ? std::string("; it takes only --config and --set") : "; known:" + known));
  }
}

std::string usage_text(const std::string& program) {
  std::string text = fmt::format(
      "{0}: train GPT models with tensor, pipeline and data parallelism\n\n"
      "usage: {0} [SUBCOMMAND] [--config FILE] [--set key.path=value ...] [options]\n\n"
      "subcommands:\n",
      program);
  for (const Subcommand& s : subcommands()) text += fmt::format("  {:<10} {}\n", s.name, s.summary);
  text += fmt::format(
      "\ncommon options:\n"
      "  --config FILE          YAML config (configs/tiny-cpu.yaml is a small demo)\n"
      "  --set key.path=value   override one config key, typed as in the YAML, e.g. --set model.num_layers=4\n"
      "                         or --set data.train=[a,b]; may repeat, applied in order\n"
      "  --help, -h             this text\n\n"
      "'{} config --config FILE --dump' prints every config key with its value.\n",
      program);
  return text;
}

}  // namespace gpt
