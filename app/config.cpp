// Loading, overriding, validating and dumping the run config. Everything is driven by the key table in
// app/config_schema.cpp: the YAML document is walked section by section and each value is typed by the
// C++ type of the field its key points at, so there is no per-key parsing code here. Scalars are parsed
// by hand (not by yaml-cpp's stream conversions) so "1.5" is not an int, "64" in quotes is not a number
// and every mismatch can be reported with the key, the expected type and the offending text.
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "app/config.h"
#include "app/config_model.h"
#include "app/config_paths.h"
#include "app/config_schema.h"
#include "app/config_sizes.h"

namespace gpt {
namespace {

// ---- scalar parsing -------------------------------------------------------------------------------

std::optional<int64_t> parse_int(std::string_view text) {
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::optional<double> parse_float(std::string_view text) {
  // YAML spells the special values .inf / .nan; from_chars would take "inf" and "nan" as well.
  static const std::set<std::string_view> pos_inf = {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"};
  static const std::set<std::string_view> neg_inf = {"-.inf", "-.Inf", "-.INF"};
  static const std::set<std::string_view> nan = {".nan", ".NaN", ".NAN"};
  if (pos_inf.count(text)) return INFINITY;
  if (neg_inf.count(text)) return -INFINITY;
  if (nan.count(text)) return NAN;
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::optional<bool> parse_bool(std::string_view text) {
  static const std::set<std::string_view> yes = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const std::set<std::string_view> no = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  if (yes.count(text)) return true;
  if (no.count(text)) return false;
  return std::nullopt;
}

// How a node looks, for "got ..." in error messages.
std::string describe(const YAML::Node& node) {
  if (node.IsNull()) return "nothing (null)";
  if (node.IsSequence()) return "a sequence";
  if (node.IsMap()) return "a map";
  if (node.Tag() == "!") return fmt::format("\"{}\" (a quoted string)", node.Scalar());
  return fmt::format("'{}'", node.Scalar());
}

// Stores `node` into `field`, typed by the field. Returns "" on success, else what is wrong.
std::string assign(const ConfigField& field, const YAML::Node& node) {
  struct Assigner {
    const YAML::Node& node;
    bool plain_scalar;  // quoted scalars are strings, never numbers or bools
    std::string mismatch;

    std::string operator()(int64_t* out) const {
      std::optional<int64_t> v = plain_scalar ? parse_int(node.Scalar()) : std::nullopt;
      if (!v) return mismatch;
      *out = *v;
      return "";
    }
    std::string operator()(double* out) const {
      std::optional<double> v = plain_scalar ? parse_float(node.Scalar()) : std::nullopt;
      if (!v) return mismatch;
      *out = *v;
      return "";
    }
    std::string operator()(bool* out) const {
      std::optional<bool> v = plain_scalar ? parse_bool(node.Scalar()) : std::nullopt;
      if (!v) return mismatch;
      *out = *v;
      return "";
    }
    std::string operator()(std::string* out) const {
      if (node.IsNull()) {
        out->clear();
        return "";
      }
      if (!node.IsScalar()) return mismatch;
      *out = node.Scalar();
      return "";
    }
    std::string operator()(std::vector<std::string>* out) const {
      // A sequence of strings, a single string (a one-element list) or nothing (the empty list).
      std::vector<std::string> items;
      if (node.IsScalar()) {
        items.push_back(node.Scalar());
      } else if (node.IsSequence()) {
        for (const YAML::Node& item : node) {
          if (!item.IsScalar()) return fmt::format("expects a list of strings, got an entry that is {}", describe(item));
          items.push_back(item.Scalar());
        }
      } else if (!node.IsNull()) {
        return mismatch;
      }
      for (const std::string& item : items) {
        if (item.empty()) return "has an empty entry";
      }
      *out = std::move(items);
      return "";
    }
  };
  const bool plain_scalar = node.IsScalar() && node.Tag() != "!";
  std::string mismatch = fmt::format("expects {}, got {}", config_type_name(field), describe(node));
  return std::visit(Assigner{node, plain_scalar, std::move(mismatch)}, field);
}

std::string line_of(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? std::string() : fmt::format(" (line {})", mark.line + 1);
}

std::string unknown_key_message(const std::string& path) {
  std::string message = fmt::format("unknown key '{}'", path);
  std::string suggestion = closest_config_key(path);
  if (!suggestion.empty() && suggestion != path) message += fmt::format(" (did you mean '{}'?)", suggestion);
  return message;
}

// ---- the YAML document ----------------------------------------------------------------------------

void apply_yaml(Config& c, const YAML::Node& root) {
  auto fail = [&](const std::string& what, const YAML::Node& at) {
    throw ConfigError(fmt::format("config {}: {}{}", c.source, what, line_of(at)));
  };
  if (root.IsNull()) return;  // an empty file: all defaults
  if (!root.IsMap()) fail(fmt::format("the document must be a map of keys, got {}", describe(root)), root);

  std::set<std::string> seen;
  auto set_key = [&](const std::string& path, const YAML::Node& key_node, const YAML::Node& value) {
    const ConfigKey* key = find_config_key(path);
    if (!key) fail(unknown_key_message(path), key_node);
    if (!seen.insert(path).second) fail(fmt::format("key '{}' is given twice", path), key_node);
    std::string error = assign(key->field(c), value);
    if (!error.empty()) fail(fmt::format("key '{}' {}", path, error), key_node);
  };

  for (const auto& entry : root) {
    if (!entry.first.IsScalar()) fail(fmt::format("keys must be plain names, got {}", describe(entry.first)), entry.first);
    const std::string name = entry.first.Scalar();
    if (find_config_key(name) || !is_config_section(name)) {
      set_key(name, entry.first, entry.second);
      continue;
    }
    if (entry.second.IsNull()) continue;  // "model:" with nothing under it
    if (!entry.second.IsMap())
      fail(fmt::format("section '{}' must be a map of {}.* keys, got {}", name, name, describe(entry.second)), entry.first);
    if (!seen.insert(name).second) fail(fmt::format("section '{}' is given twice", name), entry.first);
    for (const auto& sub : entry.second) {
      if (!sub.first.IsScalar()) fail(fmt::format("keys must be plain names, got {}", describe(sub.first)), sub.first);
      set_key(name + "." + sub.first.Scalar(), sub.first, sub.second);
    }
  }
}

// ---- dump -----------------------------------------------------------------------------------------

// Shortest text that reads back to the same double, always recognisable as a float.
std::string format_float(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
  std::string text(buffer, end);
  // YAML 1.1 readers (PyYAML) need a '.' in the mantissa to see a float: 6e-04 -> 6.0e-04, 1 -> 1.0.
  size_t exponent = text.find('e');
  if (text.substr(0, exponent).find('.') == std::string::npos) text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
  return text;
}

void emit_value(YAML::Emitter& out, const ConfigField& field) {
  struct Emit {
    YAML::Emitter& out;
    void operator()(int64_t* v) const { out << static_cast<long long>(*v); }
    void operator()(double* v) const { out << format_float(*v); }
    void operator()(bool* v) const { out << YAML::TrueFalseBool << *v; }
    void operator()(std::string* v) const { out << *v; }
    void operator()(std::vector<std::string>* v) const {
      out << YAML::Flow << YAML::BeginSeq;
      for (const std::string& item : *v) out << item;
      out << YAML::EndSeq;
    }
  };
  std::visit(Emit{out}, field);
}

// ---- validation -----------------------------------------------------------------------------------

// The split string: three comma-separated non-negative numbers, not all zero. Returns "" when valid.
std::string split_error(const std::string& split) {
  std::vector<std::string> parts;
  std::stringstream stream(split);
  std::string part;
  while (std::getline(stream, part, ',')) parts.push_back(part);
  if (!split.empty() && split.back() == ',') parts.push_back("");
  if (parts.size() != 3) return fmt::format("must be three comma-separated weights like '969,30,1', got '{}'", split);
  double sum = 0;
  for (std::string& p : parts) {
    size_t first = p.find_first_not_of(" \t"), last = p.find_last_not_of(" \t");
    std::string trimmed = first == std::string::npos ? "" : p.substr(first, last - first + 1);
    std::optional<double> v = parse_float(trimmed);
    if (!v || !std::isfinite(*v) || *v < 0)
      return fmt::format("weights must be non-negative numbers, got '{}' in '{}'", trimmed, split);
    sum += *v;
  }
  if (sum <= 0) return fmt::format("weights must not all be zero, got '{}'", split);
  return "";
}

}  // namespace

int64_t Config::ffn_hidden() const {
  return model.ffn_hidden_size ? model.ffn_hidden_size : default_ffn_width(model.hidden_size, model.swiglu);
}

void validate_config(const Config& c) {
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) throw ConfigError(fmt::format("config {}: {}", c.source, what));
  };
  // Comparisons are written so that NaN fails them.
  auto at_least = [&](const char* key, int64_t value, int64_t min) {
    require(value >= min, fmt::format("{} must be >= {}, got {}", key, min, value));
  };
  auto non_negative = [&](const char* key, double value) {
    require(value >= 0, fmt::format("{} must be >= 0, got {}", key, value));
  };
  auto positive = [&](const char* key, double value) {
    require(value > 0, fmt::format("{} must be > 0, got {}", key, value));
  };
  auto unit_interval = [&](const char* key, double value) {
    require(value >= 0 && value < 1, fmt::format("{} must be in [0, 1), got {}", key, value));
  };

  // Every float key is finite (the YAML .inf/.nan and the plain inf/nan spellings all parse as floats).
  for (const ConfigKey& key : config_keys()) {
    const ConfigField field = key.field(const_cast<Config&>(c));
    if (const double* const* value = std::get_if<double*>(&field))
      require(std::isfinite(**value), fmt::format("{} must be a finite number, got {}", key.path, **value));
  }

  // Keys with a fixed set of values, straight from the key table.
  for (const ConfigKey& key : config_keys()) {
    if (key.choices.empty()) continue;
    const std::string& value = *std::get<std::string*>(key.field(const_cast<Config&>(c)));
    bool allowed = false;
    std::string listed;
    for (std::string_view choice : key.choices) {
      allowed = allowed || value == choice;
      listed += (listed.empty() ? "" : ", ") + std::string(choice);
    }
    require(allowed, fmt::format("{} must be one of {{{}}}, got '{}'", key.path, listed, value));
  }

  const ModelConfig& m = c.model;
  at_least("model.num_layers", m.num_layers, 1);
  at_least("model.hidden_size", m.hidden_size, 1);
  at_least("model.num_heads", m.num_heads, 1);
  require(m.ffn_hidden_size >= 0,
          fmt::format("model.ffn_hidden_size must be >= 1 (or 0 for the default width), got {}", m.ffn_hidden_size));
  at_least("model.seq_length", m.seq_length, 1);
  at_least("model.vocab_size", m.vocab_size, 2);
  at_least("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by, 1);
  positive("model.layernorm_eps", m.layernorm_eps);
  positive("model.init_std", m.init_std);

  const ParallelConfig& p = c.parallel;
  at_least("parallel.tensor", p.tensor, 1);
  at_least("parallel.pipeline", p.pipeline, 1);
  at_least("parallel.virtual_pipeline", p.virtual_pipeline, 1);
  at_least("parallel.data", p.data, 0);
  at_least("parallel.context", p.context, 1);
  at_least("parallel.bucket_size_mb", p.bucket_size_mb, 1);

  at_least("precision.fp8_amax_history_len", c.precision.fp8_amax_history_len, 1);
  at_least("precision.fp8_margin", c.precision.fp8_margin, 0);
  require(c.precision.fp8_margin <= 30,
          fmt::format("precision.fp8_margin must be <= 30, got {}", c.precision.fp8_margin));

  const TrainingConfig& t = c.training;
  at_least("training.micro_batch_size", t.micro_batch_size, 1);
  at_least("training.global_batch_size", t.global_batch_size, 1);
  at_least("training.train_iters", t.train_iters, 1);
  at_least("training.threads", t.threads, 0);
  non_negative("training.step_timeout_s", t.step_timeout_s);
  non_negative("training.startup_timeout_s", t.startup_timeout_s);
  at_least("training.max_nonfinite_steps", t.max_nonfinite_steps, 0);
  non_negative("training.exit_duration_mins", t.exit_duration_mins);
  at_least("training.exit_interval", t.exit_interval, 0);

  const OptimizerConfig& o = c.optimizer;
  non_negative("optimizer.lr", o.lr);
  non_negative("optimizer.min_lr", o.min_lr);
  require(o.min_lr <= o.lr, fmt::format("optimizer.min_lr ({}) must be <= optimizer.lr ({})", o.min_lr, o.lr));
  at_least("optimizer.warmup_iters", o.warmup_iters, 0);
  at_least("optimizer.decay_iters", o.decay_iters, 0);
  non_negative("optimizer.weight_decay", o.weight_decay);
  unit_interval("optimizer.beta1", o.beta1);
  unit_interval("optimizer.beta2", o.beta2);
  positive("optimizer.eps", o.eps);
  non_negative("optimizer.clip_grad", o.clip_grad);

  std::string split = split_error(c.data.split);
  require(split.empty(), "data.split " + split);
  for (const auto* list : {&c.data.train, &c.data.valid}) {
    for (const std::string& item : *list)
      require(!item.empty(), fmt::format("{} has an empty entry", list == &c.data.train ? "data.train" : "data.valid"));
  }

  at_least("checkpoint.save_interval", c.checkpoint.save_interval, 0);
  at_least("checkpoint.keep_last", c.checkpoint.keep_last, 0);
  non_negative("checkpoint.lock_stale_s", c.checkpoint.lock_stale_s);
  require(!c.checkpoint.finetune || !c.checkpoint.load.empty(),
          "checkpoint.finetune is true but checkpoint.load is empty: name the checkpoint to fine-tune from");
  require(c.checkpoint.save_interval == 0 || !c.checkpoint.dir.empty(),
          fmt::format("checkpoint.save_interval is {} but checkpoint.dir is empty", c.checkpoint.save_interval));
  at_least("eval.interval", c.eval.interval, 0);
  at_least("eval.iters", c.eval.iters, c.eval.interval > 0 ? 1 : 0);
  at_least("logging.interval", c.logging.interval, 1);
  non_negative("logging.peak_tflops", c.logging.peak_tflops);

  // Sizes derived from several keys (products that could overflow) before the relations divide by them.
  check_derived_sizes(c);

  // Relations between keys.
  require(m.hidden_size % m.num_heads == 0,
          fmt::format("model.hidden_size ({}) must be divisible by model.num_heads ({})", m.hidden_size, m.num_heads));
  require(t.global_batch_size % t.micro_batch_size == 0,
          fmt::format("training.global_batch_size ({}) must be divisible by training.micro_batch_size ({})",
                      t.global_batch_size, t.micro_batch_size));
  require(p.data == 0 || t.global_batch_size % (t.micro_batch_size * p.data) == 0,
          fmt::format("training.global_batch_size ({}) must be divisible by training.micro_batch_size * "
                      "parallel.data ({} * {})",
                      t.global_batch_size, t.micro_batch_size, p.data));
  require(m.num_layers % (p.pipeline * p.virtual_pipeline) == 0,
          fmt::format("model.num_layers ({}) must be divisible by parallel.pipeline * parallel.virtual_pipeline "
                      "({} * {})",
                      m.num_layers, p.pipeline, p.virtual_pipeline));
  require(m.num_heads % p.tensor == 0,
          fmt::format("model.num_heads ({}) must be divisible by parallel.tensor ({})", m.num_heads, p.tensor));
  try {
    model_description_from_config(c).validate();
  } catch (const std::invalid_argument& e) {
    require(false, e.what());
  }
  require(m.num_query_groups == 0 || m.num_query_groups % p.tensor == 0,
          fmt::format("model.num_query_groups ({}) must be divisible by parallel.tensor ({}): each rank holds whole "
                      "key/value groups (replicating them over more tensor-parallel ranks than groups is not "
                      "supported)",
                      m.num_query_groups, p.tensor));
  require(c.ffn_hidden() % p.tensor == 0,
          fmt::format("model.ffn_hidden_size ({}) must be divisible by parallel.tensor ({})", c.ffn_hidden(), p.tensor));
  require(m.seq_length % (2 * p.context) == 0,
          fmt::format("model.seq_length ({}) must be divisible by 2 x parallel.context (2 x {}): context parallelism "
                      "cuts each sequence into 2 x parallel.context equal chunks",
                      m.seq_length, p.context));
  require(!p.tp_comm_overlap || p.sequence_parallel,
          "parallel.tp_comm_overlap needs parallel.sequence_parallel: true (the overlap pipelines the "
          "sequence-parallel all-gathers and reduce-scatters with the GEMMs; Megatron asserts the same)");
  require(!p.sequence_parallel || (m.seq_length / p.context) % p.tensor == 0,
          p.context == 1 ? fmt::format("model.seq_length ({}) must be divisible by parallel.tensor ({}) with "
                                       "parallel.sequence_parallel",
                                       m.seq_length, p.tensor)
                         : fmt::format("model.seq_length / parallel.context ({} / {}) must be divisible by "
                                       "parallel.tensor ({}) with parallel.sequence_parallel",
                                       m.seq_length, p.context, p.tensor));
}

void apply_overrides(Config& c, const std::vector<std::string>& overrides) {
  for (const std::string& override_text : overrides) {
    auto fail = [&](const std::string& what) { throw ConfigError(fmt::format("config {}: --set {}", c.source, what)); };
    auto fail_key = [&](const std::string& what) { throw ConfigError(fmt::format("config {}: --set: {}", c.source, what)); };
    size_t eq = override_text.find('=');
    if (eq == std::string::npos || eq == 0) fail(fmt::format("'{}' must look like key.path=value", override_text));
    const std::string path = override_text.substr(0, eq);
    const std::string value_text = override_text.substr(eq + 1);
    const ConfigKey* key = find_config_key(path);
    if (!key) {
      if (is_config_section(path))
        fail_key(fmt::format("'{}' is a section; set its keys one by one, e.g. {}.<key>=...", path, path));
      fail_key(unknown_key_message(path));
    }
    YAML::Node value;
    try {
      value = YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
      fail(fmt::format("{}: cannot parse the value as YAML: {}", override_text, e.msg));
    }
    std::string error = assign(key->field(c), value);
    if (!error.empty()) fail(fmt::format("{}: key '{}' {}", override_text, path, error));
  }
}

Config load_config_string(const std::string& yaml, const std::string& source,
                          const std::vector<std::string>& overrides) {
  Config c;
  c.source = source;
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("config {}: invalid YAML at line {}, column {}: {}", source, e.mark.line + 1,
                                  e.mark.column + 1, e.msg));
  }
  apply_yaml(c, root);
  apply_overrides(c, overrides);
  resolve_config_paths(c);
  validate_config(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("config {}: is a directory, not a YAML file", path));
  std::ifstream file(path, std::ios::binary);
  if (!file) throw ConfigError(fmt::format("config {}: cannot open the file", path));
  std::stringstream text;
  text << file.rdbuf();
  if (file.bad()) throw ConfigError(fmt::format("config {}: cannot read the file", path));
  return load_config_string(text.str(), path, overrides);
}

std::string dump_config(const Config& c, bool with_help) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string open_section;  // sections are contiguous in the key table
  for (const ConfigKey& key : config_keys()) {
    std::string path = key.path;
    size_t dot = path.find('.');
    std::string section = dot == std::string::npos ? "" : path.substr(0, dot);
    if (section != open_section) {
      if (!open_section.empty()) out << YAML::EndMap;
      if (!section.empty()) out << YAML::Key << section << YAML::Value << YAML::BeginMap;
      open_section = section;
    }
    out << YAML::Key << (dot == std::string::npos ? path : path.substr(dot + 1)) << YAML::Value;
    emit_value(out, key.field(const_cast<Config&>(c)));
    if (with_help) {
      std::string help = key.help;
      for (size_t i = 0; i < key.choices.size(); ++i) help += (i ? " | " : ": ") + std::string(key.choices[i]);
      out << YAML::Comment(help);
    }
  }
  if (!open_section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string dump_config(const Config& c) { return dump_config(c, false); }

}  // namespace gpt
