// Home-directory expansion of the path-valued config keys and the data specs' words (see
// app/config_paths.h).
#include "app/config_paths.h"

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "app/config.h"
#include "app/config_schema.h"
#include "data/shard_source.h"

namespace gpt {

std::string expand_home(const std::string& path, const char* home) {
  if (path.empty() || path[0] != '~') return path;
  if (path.size() > 1 && path[1] != '/')
    throw std::invalid_argument(fmt::format("'{}': only ~ and ~/ (the home directory) are expanded, not ~user; "
                                            "write the full path",
                                            path));
  if (!home || !*home)
    throw std::invalid_argument(fmt::format("'{}' starts with ~ but HOME is not set; write the full path", path));
  std::string h = home;
  if (path.size() > 1 && h.size() > 1 && h.back() == '/') h.pop_back();
  return h + path.substr(1);
}

void resolve_config_paths(Config& c) {
  const char* home = std::getenv("HOME");
  for (const ConfigKey& key : config_keys()) {
    if (!key.is_path) continue;
    try {
      ConfigField field = key.field(c);
      if (std::string** value = std::get_if<std::string*>(&field)) {
        **value = expand_home(**value, home);
      } else if (std::vector<std::string>** list = std::get_if<std::vector<std::string>*>(&field)) {
        std::vector<std::string> words = data_spec_words(**list);
        for (std::string& word : words) word = expand_home(word, home);
        **list = std::move(words);
      }
    } catch (const std::invalid_argument& e) {
      throw ConfigError(fmt::format("config {}: {} {}", c.source, key.path, e.what()));
    }
  }
}

}  // namespace gpt
