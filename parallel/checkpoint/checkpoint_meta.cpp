// Checkpoint bookkeeping without I/O: element runs of shards and their intersection (the arithmetic that
// lets any layout read any other layout's pieces), CRC-32, and the metadata index as YAML (written with
// yaml-cpp's emitter, read back with range and type checks that name the key that is wrong).
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <fmt/format.h>

#include "model/model_description.h"
#include "parallel/checkpoint/checkpoint_format.h"

namespace gpt {

std::vector<ElementRun> shard_runs(const Shape& global, const ShardSpec& shard, int64_t begin, int64_t end) {
  std::vector<ElementRun> out;
  if (begin >= end) return out;
  if (shard.dim < 0) {
    out.push_back({begin, begin, end - begin});
    return out;
  }
  // Local elements with the same outer index and block are consecutive globally too: a segment is one
  // block's piece of the sharded dimension times everything inside it.
  // Local elements with the same outer index and block are consecutive globally too: a segment is one
  // block's piece of the sharded dimension times everything inside it.
  const ShardIndexMap map(shard, global);
  const int64_t inner = map.inner(), slab = map.local_dim() * inner;
  for (int64_t lo = begin; lo < end;) {
    const int64_t outer = lo / slab, coord = (lo % slab) / inner;
    const int64_t hi = std::min(end, outer * slab + map.block_end(coord) * inner);
    const int64_t g = map(lo);
    if (!out.empty() && out.back().global + out.back().length == g)
      out.back().length += hi - lo;  // adjacent segments that happen to touch (one part, or whole rows)
    else
      out.push_back({g, lo, hi - lo});
    lo = hi;
  }
  return out;
}

std::vector<ElementCopy> intersect_runs(const std::vector<ElementRun>& stored, int64_t stored_begin,
                                        const std::vector<ElementRun>& wanted, int64_t wanted_begin) {
  std::vector<ElementCopy> out;
  size_t i = 0, j = 0;
  while (i < stored.size() && j < wanted.size()) {
    const ElementRun& a = stored[i];
    const ElementRun& b = wanted[j];
    const int64_t lo = std::max(a.global, b.global);
    const int64_t hi = std::min(a.global + a.length, b.global + b.length);
    if (lo < hi)
      out.push_back({a.local + (lo - a.global) - stored_begin, b.local + (lo - b.global) - wanted_begin, hi - lo});
    if (a.global + a.length < b.global + b.length)
      ++i;
    else
      ++j;
  }
  return out;
}

int64_t count_below(const Shape& global, const ShardSpec& shard, int64_t begin, int64_t end, int64_t limit) {
  int64_t n = 0;
  for (const ElementRun& r : shard_runs(global, shard, begin, end))
    n += std::max<int64_t>(0, std::min(r.global + r.length, limit) - r.global);
  return n;
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), bytes));
}

uint32_t crc32_bytes(const void* data, size_t bytes) {
  return crc32_update(static_cast<uint32_t>(crc32_z(0L, Z_NULL, 0)), data, bytes);
}

std::string stored_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    default: throw CheckpointError(std::string("checkpoint: cannot store tensors of dtype ") + dtype_name(t));
  }
}

DType stored_dtype_from_name(const std::string& name, const std::string& where) {
  if (name == "f32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "f16") return DType::F16;
  throw CheckpointError(where + ": unknown stored dtype '" + name + "' (expected f32, bf16 or f16)");
}

namespace {

void emit_shape(YAML::Emitter& out, const Shape& s) {
  out << YAML::Flow << YAML::BeginSeq;
  for (int64_t d : s) out << d;
  out << YAML::EndSeq;
}

void emit_file(YAML::Emitter& out, const StoredFile& f) {
  out << YAML::BeginMap << YAML::Key << "file" << YAML::Value << f.file << YAML::Key << "rank" << YAML::Value
      << f.rank << YAML::Key << "bytes" << YAML::Value << f.bytes << YAML::Key << "pieces" << YAML::Value
      << YAML::BeginSeq;
  for (const StoredPiece& p : f.pieces) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "kind" << YAML::Value << p.kind << YAML::Key << "name"
        << YAML::Value << p.name << YAML::Key << "shard" << YAML::Value << YAML::Flow << p.shard.to_ints() << YAML::Key << "range"
        << YAML::Value << YAML::Flow << YAML::BeginSeq << p.begin << p.end << YAML::EndSeq << YAML::Key << "dtype"
        << YAML::Value << stored_dtype_name(p.dtype) << YAML::Key << "crc32" << YAML::Value
        << fmt::format("{:08x}", p.crc32) << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
}

// Typed access that names the key and the source on every failure.
struct Reader {
  std::string source;

  YAML::Node child(const YAML::Node& n, const char* key, const std::string& path) const {
    if (!n.IsMap()) throw CheckpointError(source + ": " + (path.empty() ? "document" : path) + " is not a mapping");
    YAML::Node c = n[key];
    if (!c) throw CheckpointError(source + ": missing key '" + join(path, key) + "'");
    return c;
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  template <typename T>
  T get(const YAML::Node& n, const char* key, const std::string& path = "") const {
    YAML::Node c = child(n, key, path);
    try {
      return c.as<T>();
    } catch (const YAML::Exception&) {
      throw CheckpointError(source + ": key '" + join(path, key) + "' has an invalid value");
    }
  }
  [[noreturn]] void out_of_range(const std::string& key, const std::string& value, const std::string& rule) const {
    throw CheckpointError(source + ": key '" + key + "' is " + value + "; " + rule);
  }
  // An integer that must be at least `lo` (and at most `hi`, described as `hi_what` when given).
  int64_t get_int(const YAML::Node& n, const char* key, const std::string& path, int64_t lo,
                  int64_t hi = INT64_MAX, const std::string& hi_what = "") const {
    const int64_t v = get<int64_t>(n, key, path);
    if (v < lo) out_of_range(join(path, key), std::to_string(v), fmt::format("it must be >= {}", lo));
    if (v > hi) out_of_range(join(path, key), std::to_string(v), fmt::format("it must be <= {}{}", hi, hi_what));
    return v;
  }
  // A list of integers, each at least `min`.
  Shape shape(const YAML::Node& n, const std::string& key, int64_t min) const {
    if (!n.IsSequence()) throw CheckpointError(source + ": key '" + key + "' is not a list of integers");
    Shape s;
    int64_t numel = 1;
    for (const auto& d : n) {
      int64_t v = 0;
      try {
        v = d.as<int64_t>();
      } catch (const YAML::Exception&) {
        throw CheckpointError(source + ": key '" + key + "' holds a non-integer");
      }
      if (v < min)
        throw CheckpointError(fmt::format("{}: key '{}' holds {}; each value must be >= {}", source, key, v, min));
      if (__builtin_mul_overflow(numel, v, &numel))
        throw CheckpointError(fmt::format("{}: key '{}': the element count overflows a 64-bit integer", source, key));
      s.push_back(v);
    }
    return s;
  }

  StoredFile file(const YAML::Node& n, const std::string& path) const {
    StoredFile f;
    f.file = get<std::string>(n, "file", path);
    if (f.file.empty() || f.file.find('/') != std::string::npos || f.file[0] == '.')
      throw CheckpointError(source + ": " + path + ".file '" + f.file + "' is not a plain file name");
    f.rank = static_cast<int>(get_int(n, "rank", path, 0, INT32_MAX));
    f.bytes = get_int(n, "bytes", path, 0);
    YAML::Node pieces = child(n, "pieces", path);
    if (!pieces.IsSequence()) throw CheckpointError(source + ": " + path + ".pieces is not a list");
    for (size_t i = 0; i < pieces.size(); ++i) {
      const std::string pp = fmt::format("{}.pieces[{}]", path, i);
      StoredPiece p;
      p.kind = get<std::string>(pieces[i], "kind", pp);
      if (p.kind != "model" && p.kind != "master" && p.kind != "adam_m" && p.kind != "adam_v" && p.kind != "fp8")
        throw CheckpointError(source + ": " + pp + ".kind '" + p.kind +
                              "' is not model, master, adam_m, adam_v or fp8");
      p.name = get<std::string>(pieces[i], "name", pp);
      Shape sh = shape(child(pieces[i], "shard", pp), pp + ".shard", -1);  // dim -1: not sharded
      try {
        p.shard = ShardSpec::from_ints(sh);
      } catch (const std::invalid_argument& e) {
        throw CheckpointError(source + ": key '" + pp + ".shard' " + e.what());
      }
      Shape range = shape(child(pieces[i], "range", pp), pp + ".range", 0);
      if (range.size() != 2 || range[0] >= range[1])
        throw CheckpointError(source + ": key '" + pp + ".range' is not a range [begin, end) with begin < end");
      p.begin = range[0];
      p.end = range[1];
      p.dtype = stored_dtype_from_name(get<std::string>(pieces[i], "dtype", pp), source + ": " + pp);
      const std::string crc = get<std::string>(pieces[i], "crc32", pp);
      try {
        size_t used = 0;
        unsigned long v = std::stoul(crc, &used, 16);
        if (used != crc.size() || v > 0xffffffffUL) throw std::invalid_argument("range");
        p.crc32 = static_cast<uint32_t>(v);
      } catch (const std::exception&) {
        throw CheckpointError(source + ": " + pp + ".crc32 '" + crc + "' is not a hexadecimal CRC-32");
      }
      f.pieces.push_back(std::move(p));
    }
    return f;
  }
};

YAML::Node parse(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw CheckpointError(source + ": not valid YAML (" + e.what() + ")");
  }
}

void flatten(const YAML::Node& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n) flatten(kv.second, prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>(), out);
  } else if (n.IsSequence()) {
    std::string s = "[";
    for (size_t i = 0; i < n.size(); ++i) s += (i ? ", " : "") + (n[i].IsScalar() ? n[i].Scalar() : YAML::Dump(n[i]));
    out[prefix] = s + "]";
  } else if (n.IsScalar()) {
    out[prefix] = n.Scalar();
  } else {
    out[prefix] = "";
  }
}

}  // namespace

std::string stored_file_to_yaml(const StoredFile& file) {
  YAML::Emitter out;
  emit_file(out, file);
  return out.c_str();
}

StoredFile stored_file_from_yaml(const std::string& text, const std::string& source) {
  return Reader{source}.file(parse(text, source), "file");
}

std::string checkpoint_meta_to_yaml(const CheckpointMeta& m) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "format" << YAML::Value << "gpt-train distributed checkpoint";
  out << YAML::Key << "version" << YAML::Value << m.version;
  out << YAML::Key << "iteration" << YAML::Value << m.iteration;
  out << YAML::Key << "parent" << YAML::Value << m.parent;
  out << YAML::Key << "id" << YAML::Value << m.id;
  out << YAML::Key << "parent_id" << YAML::Value << m.parent_id;
  out << YAML::Key << "saved_at" << YAML::Value << fmt::format("{:.3f}", m.saved_at);
  out << YAML::Key << "consumed_samples" << YAML::Value << m.consumed_samples;
  out << YAML::Key << "optimizer_steps" << YAML::Value << m.optimizer_steps;
  out << YAML::Key << "has_optimizer_state" << YAML::Value << m.has_optimizer_state;
  out << YAML::Key << "master_weights" << YAML::Value << m.master_weights;
  out << YAML::Key << "dtype" << YAML::Value << m.dtype;
  out << YAML::Key << "loss_scaler" << YAML::Value << YAML::BeginMap << YAML::Key << "dynamic" << YAML::Value
      << m.loss_scaler_dynamic << YAML::Key << "scale" << YAML::Value << fmt::format("{:.17g}", m.loss_scaler.scale)
      << YAML::Key << "growth_tracker" << YAML::Value << m.loss_scaler.growth_tracker << YAML::Key
      << "hysteresis_tracker" << YAML::Value << m.loss_scaler.hysteresis_tracker << YAML::EndMap;
  const SavedLayout& l = m.layout;
  out << YAML::Key << "layout" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "tensor" << YAML::Value
      << l.tensor << YAML::Key << "pipeline" << YAML::Value << l.pipeline << YAML::Key << "virtual_pipeline"
      << YAML::Value << l.virtual_pipeline << YAML::Key << "data" << YAML::Value << l.data << YAML::Key << "world"
      << YAML::Value << l.world << YAML::Key << "distributed_optimizer" << YAML::Value << l.distributed_optimizer
      << YAML::EndMap;
  out << YAML::Key << "vocab_size" << YAML::Value << m.vocab_size;
  out << YAML::Key << "padded_vocab" << YAML::Value << m.padded_vocab;
  out << YAML::Key << "rng" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "generator"
      << YAML::Value << "counter-based" << YAML::Key << "seed" << YAML::Value << m.rng_seed << YAML::EndMap;
  out << YAML::Key << "tensors" << YAML::Value << YAML::BeginMap;
  for (const auto& [name, shape] : m.tensors) {
    out << YAML::Key << name << YAML::Value;
    emit_shape(out, shape);
  }
  out << YAML::EndMap;
  out << YAML::Key << "files" << YAML::Value << YAML::BeginSeq;
  for (const StoredFile& f : m.files) emit_file(out, f);
  out << YAML::EndSeq;
  if (!m.tokenizer.empty()) {
    const TokenizerRecord& t = m.tokenizer;
    out << YAML::Key << "tokenizer" << YAML::Value << YAML::BeginMap << YAML::Key << "name" << YAML::Value << t.name
        << YAML::Key << "hash" << YAML::Value << t.hash << YAML::Key << "vocab_size" << YAML::Value << t.vocab_size
        << YAML::Key << "eod_id" << YAML::Value << t.eod_id << YAML::Key << "files" << YAML::Value << YAML::Flow
        << YAML::BeginMap;
    for (const auto& [role, file] : t.files) out << YAML::Key << role << YAML::Value << file;
    out << YAML::EndMap << YAML::EndMap;
  }
  out << YAML::Key << "config" << YAML::Value << YAML::Literal << m.config_yaml;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

CheckpointMeta checkpoint_meta_from_yaml(const std::string& text, const std::string& source) {
  Reader r{source};
  YAML::Node root = parse(text, source);
  if (!root.IsMap()) throw CheckpointError(source + ": not a checkpoint index (expected a YAML mapping)");
  CheckpointMeta m;
  if (r.get<std::string>(root, "format") != "gpt-train distributed checkpoint")
    throw CheckpointError(source + ": not a gpt-train checkpoint index (key 'format')");
  m.version = r.get<int64_t>(root, "version");
  if (m.version != 1)
    throw CheckpointError(fmt::format("{}: checkpoint format version {} is not supported (this build reads 1)",
                                      source, m.version));
  m.iteration = r.get_int(root, "iteration", "", 0);
  // The previous checkpoint of this one's lineage (absent in indexes written before it was recorded).
  if (root["parent"] && !root["parent"].IsNull()) m.parent = r.get<std::string>(root, "parent");
  if (root["id"] && !root["id"].IsNull()) m.id = r.get<std::string>(root, "id");
  if (root["parent_id"] && !root["parent_id"].IsNull()) m.parent_id = r.get<std::string>(root, "parent_id");
  if (root["saved_at"] && !root["saved_at"].IsNull()) m.saved_at = r.get<double>(root, "saved_at");
  m.consumed_samples = r.get_int(root, "consumed_samples", "", 0);
  // At most one optimizer step per iteration (fewer when fp16 overflow skipped some).
  m.optimizer_steps = r.get_int(root, "optimizer_steps", "", 0, m.iteration, " (the iteration)");
  m.has_optimizer_state = r.get<bool>(root, "has_optimizer_state");
  m.master_weights = r.get<bool>(root, "master_weights");
  m.dtype = r.get<std::string>(root, "dtype");
  YAML::Node ls = r.child(root, "loss_scaler", "");
  m.loss_scaler_dynamic = r.get<bool>(ls, "dynamic", "loss_scaler");
  m.loss_scaler.scale = r.get<double>(ls, "scale", "loss_scaler");
  if (!std::isfinite(m.loss_scaler.scale) || m.loss_scaler.scale <= 0)
    r.out_of_range("loss_scaler.scale", fmt::format("{}", m.loss_scaler.scale), "it must be finite and > 0");
  m.loss_scaler.growth_tracker = r.get_int(ls, "growth_tracker", "loss_scaler", 0);
  // Counts down on each overflow without a floor (as Megatron's), so it may be negative.
  m.loss_scaler.hysteresis_tracker = r.get<int64_t>(ls, "hysteresis_tracker", "loss_scaler");
  YAML::Node l = r.child(root, "layout", "");
  m.layout.world = r.get_int(l, "world", "layout", 1, INT32_MAX);
  m.layout.tensor = r.get_int(l, "tensor", "layout", 1, m.layout.world, " (layout.world)");
  m.layout.pipeline = r.get_int(l, "pipeline", "layout", 1, m.layout.world, " (layout.world)");
  m.layout.virtual_pipeline = r.get_int(l, "virtual_pipeline", "layout", 1, INT32_MAX);
  m.layout.data = r.get_int(l, "data", "layout", 1, m.layout.world, " (layout.world)");
  const SavedLayout& sl = m.layout;  // world == tensor x pipeline x data, without forming the product
  if (sl.world % sl.tensor != 0 || sl.world / sl.tensor % sl.pipeline != 0 ||
      sl.world / sl.tensor / sl.pipeline != sl.data)
    r.out_of_range("layout.world", std::to_string(m.layout.world),
                   fmt::format("it must equal tensor x pipeline x data = {} x {} x {}", m.layout.tensor,
                               m.layout.pipeline, m.layout.data));
  m.layout.distributed_optimizer = r.get<bool>(l, "distributed_optimizer", "layout");
  m.vocab_size = r.get_int(root, "vocab_size", "", 1);
  m.padded_vocab = r.get_int(root, "padded_vocab", "", m.vocab_size);
  m.rng_seed = r.get<int64_t>(r.child(root, "rng", ""), "seed", "rng");
  YAML::Node tensors = r.child(root, "tensors", "");
  if (!tensors.IsMap()) throw CheckpointError(source + ": 'tensors' is not a mapping of name -> shape");
  for (const auto& kv : tensors) {
    const std::string name = kv.first.as<std::string>();
    m.tensors[name] = r.shape(kv.second, "tensors." + name, 1);
  }
  YAML::Node files = r.child(root, "files", "");
  if (!files.IsSequence()) throw CheckpointError(source + ": 'files' is not a list");
  for (size_t i = 0; i < files.size(); ++i) {
    StoredFile f = r.file(files[i], fmt::format("files[{}]", i));
    if (f.rank >= m.layout.world)
      r.out_of_range(fmt::format("files[{}].rank", i), std::to_string(f.rank),
                     fmt::format("it must be < layout.world ({})", m.layout.world));
    for (const StoredPiece& p : f.pieces) {
      auto it = m.tensors.find(p.name);
      if (it == m.tensors.end())
        throw CheckpointError(source + ": file " + f.file + " holds tensor '" + p.name + "' missing from 'tensors'");
      try {
        int64_t local = shape_numel(p.shard.local_shape(it->second));
        if (p.end > local || (p.shard.dim >= 0 && p.shard.dim >= int(it->second.size())))
          throw std::invalid_argument("range past the shard");
      } catch (const std::exception&) {
        throw CheckpointError(source + ": file " + f.file + ": piece " + p.dataset() + " does not fit tensor shape " +
                              shape_str(it->second));
      }
    }
    m.files.push_back(std::move(f));
  }
  m.config_yaml = r.get<std::string>(root, "config");
  if (root["tokenizer"] && !root["tokenizer"].IsNull()) {  // absent in indexes written before it was recorded
    YAML::Node t = root["tokenizer"];
    m.tokenizer.name = r.get<std::string>(t, "name", "tokenizer");
    m.tokenizer.hash = r.get<std::string>(t, "hash", "tokenizer");
    m.tokenizer.vocab_size = r.get_int(t, "vocab_size", "tokenizer", 1);
    m.tokenizer.eod_id = r.get_int(t, "eod_id", "tokenizer", 0, m.tokenizer.vocab_size - 1, " (tokenizer.vocab_size - 1)");
    YAML::Node files = r.child(t, "files", "tokenizer");
    if (!files.IsMap()) throw CheckpointError(source + ": 'tokenizer.files' is not a mapping of role -> file");
    for (const auto& kv : files) {
      const std::string role = kv.first.Scalar();
      if (!kv.second.IsScalar())
        throw CheckpointError(source + ": tokenizer.files." + role + " is not a file name");
      const std::string file = kv.second.Scalar();
      bool inside = !file.empty() && file.front() != '/';
      for (const auto& part : std::filesystem::path(file)) inside = inside && part != "..";
      if (!inside)
        throw CheckpointError(source + ": tokenizer.files." + role + " '" + file +
                              "' is not a path inside the checkpoint directory");
      m.tokenizer.files[role] = file;
    }
  }
  return m;
}

std::map<std::string, std::string> flatten_yaml(const std::string& text, const std::string& source) {
  std::map<std::string, std::string> out;
  flatten(parse(text, source), "", out);
  return out;
}

namespace {
std::vector<std::string> differences(const std::string& saved_yaml, const std::string& current_yaml,
                                     bool model_only, const std::string& defaults_yaml = {}) {
  auto saved = flatten_yaml(saved_yaml, "checkpoint config");
  auto current = flatten_yaml(current_yaml, "current config");
  if (!defaults_yaml.empty()) {
    const auto defaults = flatten_yaml(defaults_yaml, "default config");
    for (auto* c : {&saved, &current})
      for (const auto& [key, value] : defaults)
        if (key.rfind("model.", 0) == 0 && !c->count(key)) (*c)[key] = value;
  }
  // ffn_hidden_size 0 means the default width: compare what the model is, not how it was spelled.
  for (auto* c : {&saved, &current}) {
    auto& m = *c;
    if (m.count("model.ffn_hidden_size") && m["model.ffn_hidden_size"] == "0" && m.count("model.hidden_size")) {
      try {
        const bool swiglu = m.count("model.swiglu") && m["model.swiglu"] == "true";
        m["model.ffn_hidden_size"] = std::to_string(default_ffn_width(std::stoll(m["model.hidden_size"]), swiglu));
      } catch (const std::exception&) {
      }
    }
  }
  std::vector<std::string> out;
  std::map<std::string, int> keys;
  for (auto& kv : saved) keys[kv.first] = 1;
  for (auto& kv : current) keys[kv.first] = 1;
  for (auto& [key, unused] : keys) {
    // Not the model: the vocabulary padding rule (the padded size is checked on its own) and which attention
    // implementation runs (an execution choice; checkpoints from before the key existed lack it).
    if (model_only && (key.rfind("model.", 0) != 0 || key == "model.make_vocab_size_divisible_by" ||
                       key == "model.attention_backend"))
      continue;
    auto a = saved.find(key), b = current.find(key);
    std::string va = a == saved.end() ? "(absent)" : a->second;
    std::string vb = b == current.end() ? "(absent)" : b->second;
    if (va != vb) out.push_back(fmt::format("{}: checkpoint {}, this run {}", key, va, vb));
  }
  return out;
}
}  // namespace

std::vector<std::string> model_config_differences(const std::string& saved_yaml, const std::string& current_yaml,
                                                  const std::string& defaults_yaml) {
  return differences(saved_yaml, current_yaml, true, defaults_yaml);
}

std::vector<std::string> config_differences(const std::string& saved_yaml, const std::string& current_yaml) {
  return differences(saved_yaml, current_yaml, false);
}

}  // namespace gpt
