// Path-valued config keys (ConfigKey::is_path). A leading `~` or `~/` becomes the home directory ($HOME),
// as the shell would do had it seen the path on its own: neither YAML nor `--set key=~/x` is expanded by
// the shell, and a literal `~` directory is never what was meant. `~user` is refused with a message
// rather than taken as a directory of that name. The data specs (data.train, data.valid) are stored as
// their words (data_spec_words: a list element is one path, spaces and all; a "0.7 a 0.3 b" string is
// split), so that each path of a weighted blend is expanded too.
#pragma once
#include <string>

namespace gpt {

struct Config;

// Expands every path-valued key of `c` in place. Throws ConfigError naming the key and c.source.
void resolve_config_paths(Config& c);

// `path` with a leading ~ or ~/ replaced by `home`; other paths unchanged. Throws std::invalid_argument
// for ~user, or for a ~ path when `home` is null or empty.
std::string expand_home(const std::string& path, const char* home);

}  // namespace gpt
