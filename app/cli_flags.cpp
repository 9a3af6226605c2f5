// Flags (typed option adders over CLI11, see cli_flags.h) and the --help layout. Values are read with
// std::from_chars, whole text only, so "4x" is not 4; errors leave CLI11 as ValidationError carrying
// the message shown to the user.
#include "app/cli_flags.h"

#include <algorithm>
#include <charconv>
#include <sstream>

#include <fmt/format.h>

#include "app/cli.h"

namespace gpt {

namespace {

template <class T>
bool read_whole(const std::string& text, T& value) {
  const char* end = text.data() + text.size();
  auto [stop, ec] = std::from_chars(text.data(), end, value);
  return !text.empty() && ec == std::errc() && stop == end;
}

int64_t read_integer(const std::string& name, const std::string& text) {
  int64_t value = 0;
  if (!read_whole(text, value)) throw CLI::ValidationError(fmt::format("{} expects an integer, got '{}'", name, text));
  return value;
}

// "a", "a or b", "a, b or c".
std::string either(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i)
    out += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return out;
}

// `text` broken at spaces into lines of at most `width` characters (longer words stay whole); existing
// line breaks are kept, and a line that starts with a space (an example) is left as it is.
std::string wrap(const std::string& text, size_t width) {
  std::string out, line;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string paragraph = text.substr(start, end - start);
    line.clear();
    if (!paragraph.empty() && paragraph[0] == ' ') {
      out += paragraph + (end < text.size() ? "\n" : "");
      start = end + 1;
      continue;
    }
    size_t pos = 0;
    while (pos < paragraph.size()) {
      size_t space = paragraph.find(' ', pos);
      if (space == std::string::npos) space = paragraph.size();
      const std::string word = paragraph.substr(pos, space - pos);
      if (!line.empty() && line.size() + 1 + word.size() > width) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
      pos = space + 1;
    }
    out += line;
    if (end < text.size()) out += "\n";
    start = end + 1;
  }
  return out;
}

constexpr size_t kHelpWidth = 100;  // characters per --help line
constexpr size_t kOptionColumn = 32;

}  // namespace

CLI::Option* Flags::add(const std::string& name, const std::string& value_name, const std::string& help,
                        std::function<void(const std::string&)> store) {
  return app_.add_option_function<std::string>(name, std::move(store), help)
      ->type_name(value_name)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated option: the last value counts
}

CLI::Option* Flags::text(const std::string& name, std::string& target, const std::string& value_name,
                         const std::string& help) {
  return add(name, value_name, help, [&target](const std::string& v) { target = v; })->default_str(target);
}

CLI::Option* Flags::text(const std::string& name, std::optional<std::string>& target, const std::string& value_name,
                         const std::string& help) {
  return add(name, value_name, help, [&target](const std::string& v) { target = v; });
}

CLI::Option* Flags::texts(const std::string& name, std::vector<std::string>& target, const std::string& value_name,
                          const std::string& help) {
  return app_.add_option(name, target, help)
      ->type_name(value_name)
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

CLI::Option* Flags::choice(const std::string& name, std::string& target, const std::vector<std::string>& choices,
                           const std::string& help) {
  std::string value_name;
  for (const std::string& c : choices) value_name += (value_name.empty() ? "" : "|") + c;
  return add(name, value_name, help,
             [&target, name, choices](const std::string& v) {
               if (std::find(choices.begin(), choices.end(), v) == choices.end())
                 throw CLI::ValidationError(fmt::format("{}: expected {}, got '{}'", name, either(choices), v));
               target = v;
             })
      ->default_str(target);
}

CLI::Option* Flags::integer(const std::string& name, int64_t& target, const std::string& help) {
  return add(name, "N", help, [&target, name](const std::string& v) { target = read_integer(name, v); })
      ->default_str(std::to_string(target));
}

CLI::Option* Flags::integer(const std::string& name, int& target, const std::string& help) {
  return add(name, "N", help,
             [&target, name](const std::string& v) {
               const int64_t value = read_integer(name, v);
               if (value < INT32_MIN || value > INT32_MAX)
                 throw CLI::ValidationError(fmt::format("{} {} is out of range", name, v));
               target = static_cast<int>(value);
             })
      ->default_str(std::to_string(target));
}

CLI::Option* Flags::integer(const std::string& name, std::optional<int64_t>& target, const std::string& help) {
  return add(name, "N", help, [&target, name](const std::string& v) { target = read_integer(name, v); });
}

CLI::Option* Flags::integer(const std::string& name, uint64_t& target, const std::string& help) {
  return add(name, "N", help,
             [&target, name](const std::string& v) {
               if (!read_whole(v, target))
                 throw CLI::ValidationError(fmt::format("{} expects a non-negative integer, got '{}'", name, v));
             })
      ->default_str(std::to_string(target));
}

CLI::Option* Flags::number(const std::string& name, double& target, const std::string& help) {
  return add(name, "X", help,
             [&target, name](const std::string& v) {
               if (!read_whole(v, target))
                 throw CLI::ValidationError(fmt::format("{} expects a number, got '{}'", name, v));
             })
      ->default_str(fmt::format("{}", target));
}

CLI::Option* Flags::flag(const std::string& name, bool& target, const std::string& help) {
  return app_.add_flag(name, target, help);
}

void Flags::config(std::string& file, std::vector<std::string>& sets) {
  CLI::Option* config = text("--config", file, "FILE", "YAML config (configs/tiny-cpu.yaml is a small demo)");
  check([config, &file] {
    if (config->count() > 1)
      throw CliError(fmt::format("--config given twice ('{}' and '{}')", config->results()[0], config->results()[1]));
    if (config->count() == 1 && file.empty()) throw CliError("--config needs FILE");
  });
  app_.add_option_function<std::vector<std::string>>(
          "--set",
          [&sets](const std::vector<std::string>& values) {
            for (const std::string& v : values)
              if (v.find('=') == std::string::npos || v[0] == '=')
                throw CLI::ValidationError(fmt::format("--set '{}': expected key.path=value", v));
            sets = values;
          },
          "override one config key, typed as in the YAML (--set model.num_layers=4, --set 'data.train=[a,b]'); "
          "may repeat, applied in order")
      ->type_name("key.path=value")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

HelpFormatter::HelpFormatter() { column_width(kOptionColumn); }

std::string HelpFormatter::make_usage(const CLI::App* app, std::string name) const {
  return "usage: " + name + (app->get_parent() ? " [options]" : " [SUBCOMMAND] [options]") + "\n";
}

std::string HelpFormatter::make_option_opts(const CLI::Option* opt) const {
  if (opt->get_type_size() == 0) return "";  // a flag
  return " " + opt->get_type_name() + (opt->get_expected_max() > 1 ? " ..." : "");
}

std::string HelpFormatter::make_option_desc(const CLI::Option* opt) const {
  std::string desc = opt->get_description();
  if (!opt->get_default_str().empty()) desc += " (default: " + opt->get_default_str() + ")";
  return wrap(desc, kHelpWidth - kOptionColumn);
}

std::string HelpFormatter::make_footer(const CLI::App* app) const {
  const std::string footer = app->get_footer();
  return footer.empty() ? "" : wrap(footer, kHelpWidth) + "\n";
}

std::string HelpFormatter::make_subcommand(const CLI::App* sub) const {
  std::stringstream out;
  CLI::detail::format_help(out, sub->get_name(), wrap(sub->get_description(), kHelpWidth - kOptionColumn),
                           kOptionColumn);
  return out.str();
}

}  // namespace gpt
