// The single table of config keys: for every key its dotted path, the Config field it lives in (whose C++
// type decides how the YAML value is typed), a one-line help text and, for string keys that name one of
// a fixed set of values, the allowed choices, and whether the value is a path (~ is expanded on load).
// Parsing, --set overrides, type errors, the choice checks in validate_config, path expansion and
// dump_config all walk this table, so adding a key is one line here.
#pragma once
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "app/config.h"

namespace gpt {

// Where a key's value lives inside a Config; the alternative held is the key's type.
using ConfigField = std::variant<int64_t*, double*, bool*, std::string*, std::vector<std::string>*>;

struct ConfigKey {
  const char* path;                 // "model.hidden_size"; at most one '.', keys of a section are contiguous
  ConfigField (*field)(Config&);    // the field this key reads and writes
  const char* help;                 // one line, shown by dump_config(c, true)
  std::vector<std::string_view> choices = {};  // non-empty: the only values a string key may take
  bool is_path = false;  // a file or directory (list: data spec words): a leading ~ is expanded on load
};

// Every key in dump order.
const std::vector<ConfigKey>& config_keys();
// The key with this exact path, or nullptr.
const ConfigKey* find_config_key(std::string_view path);
// True when `name` is a section ("model", "parallel", ...), i.e. some key starts with "name.".
bool is_config_section(std::string_view name);
// The known key or section closest to a misspelt `path` ("" when nothing is close), for error messages.
std::string closest_config_key(std::string_view path);
// Levenshtein distance, for "did you mean" suggestions (config keys, subcommands).
size_t edit_distance(std::string_view a, std::string_view b);
// "int", "float", "bool", "string" or "list of strings".
const char* config_type_name(const ConfigField& field);

// Applies "key.path=value" overrides in order; the value is parsed as a YAML scalar or flow sequence and
// typed like the key. Does not validate. Throws ConfigError naming "--set" and c.source.
void apply_overrides(Config& c, const std::vector<std::string>& overrides);

// dump_config with each key's help text as a trailing comment (for `gpt-train config --dump`).
std::string dump_config(const Config& c, bool with_help);

}  // namespace gpt
