// Checkpoint <-> Hugging Face GPT-2 safetensors: an 8-byte little-endian header length, a JSON header
// {"__metadata__": {...}, name: {dtype, shape, data_offsets}, ...} (nlohmann-json) padded with spaces to a
// multiple of 8 bytes, then the raw little-endian tensors back to back. Both directions stream one tensor
// at a time, so converting needs memory for the largest tensor only.
#include "app/convert.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <map>

#include "data/json_lines.h"
#include "model/ops/half.h"
#include "parallel/checkpoint_format.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

// One tensor in both namings. HF's Conv1D stores [in, out] where our linears store [out, in].
struct TensorMap {
  std::string ours, hf;
  bool transpose = false;
  bool vocab_rows = false;  // ours has padded rows; HF keeps the real vocabulary only
};

std::vector<TensorMap> hf_gpt2_names(int64_t num_layers) {
  std::vector<TensorMap> out = {{"embedding.word_embeddings.weight", "transformer.wte.weight", false, true},
                                {"embedding.position_embeddings.weight", "transformer.wpe.weight"}};
  const std::pair<const char*, const char*> block[] = {
      {"ln1.weight", "ln_1.weight"},         {"ln1.bias", "ln_1.bias"},
      {"attention.qkv.weight", "attn.c_attn.weight"}, {"attention.qkv.bias", "attn.c_attn.bias"},
      {"attention.proj.weight", "attn.c_proj.weight"}, {"attention.proj.bias", "attn.c_proj.bias"},
      {"ln2.weight", "ln_2.weight"},         {"ln2.bias", "ln_2.bias"},
      {"mlp.fc1.weight", "mlp.c_fc.weight"}, {"mlp.fc1.bias", "mlp.c_fc.bias"},
      {"mlp.fc2.weight", "mlp.c_proj.weight"}, {"mlp.fc2.bias", "mlp.c_proj.bias"}};
  for (int64_t l = 0; l < num_layers; ++l)
    for (auto [ours, hf] : block) {
      const std::string o = ours;
      out.push_back({fmt::format("layers.{}.{}", l, o), fmt::format("transformer.h.{}.{}", l, hf),
                     o.ends_with(".weight") && o.find("ln") != 0});
    }
  out.push_back({"final_ln.weight", "transformer.ln_f.weight"});
  out.push_back({"final_ln.bias", "transformer.ln_f.bias"});
  return out;
}

// Our global shape of a tensor (word embedding: real vocabulary rows only) for a config.
std::map<std::string, Shape> our_shapes(const Config& cfg) {
  const int64_t C = cfg.model.hidden_size, F = cfg.ffn_hidden(), T = cfg.model.seq_length, V = cfg.model.vocab_size;
  std::map<std::string, Shape> s = {{"embedding.word_embeddings.weight", {V, C}},
                                    {"embedding.position_embeddings.weight", {T, C}},
                                    {"final_ln.weight", {C}},
                                    {"final_ln.bias", {C}}};
  for (int64_t l = 0; l < cfg.model.num_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    s[p + "ln1.weight"] = s[p + "ln1.bias"] = s[p + "ln2.weight"] = s[p + "ln2.bias"] = {C};
    s[p + "attention.qkv.weight"] = {3 * C, C};
    s[p + "attention.qkv.bias"] = {3 * C};
    s[p + "attention.proj.weight"] = {C, C};
    s[p + "attention.proj.bias"] = {C};
    s[p + "mlp.fc1.weight"] = {F, C};
    s[p + "mlp.fc1.bias"] = {F};
    s[p + "mlp.fc2.weight"] = {C, F};
    s[p + "mlp.fc2.bias"] = {C};
  }
  return s;
}

Shape hf_shape(const TensorMap& t, const Shape& ours) { return t.transpose ? Shape{ours[1], ours[0]} : ours; }

// [rows, cols] -> [cols, rows].
std::vector<float> transposed(const std::vector<float>& in, int64_t rows, int64_t cols) {
  std::vector<float> out(in.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * cols + j];
  return out;
}

}  // namespace

void export_hf_gpt2(const std::string& checkpoint, const std::string& safetensors_file) {
  const std::string dir = resolve_checkpoint(checkpoint);
  if (dir.empty()) throw CheckpointError("convert: " + checkpoint + " holds no checkpoint (no metadata.yaml, no latest)");
  const std::string index = dir + "/" + kMetadataFile;
  const CheckpointMeta meta = checkpoint_meta_from_yaml(read_text_file(index), index);
  Config cfg;
  try {
    cfg = load_config_string(meta.config_yaml, index + " (config)");
  } catch (const std::exception& e) {
    throw CheckpointError(std::string("convert: the config stored in the checkpoint is not usable: ") + e.what());
  }
  const std::vector<TensorMap> names = hf_gpt2_names(cfg.model.num_layers);
  const int64_t V = meta.vocab_size;

  // Header first: every shape and offset is known before any data is read.
  std::vector<Shape> ours(names.size()), theirs(names.size());
  nlohmann::ordered_json json_header;
  json_header["__metadata__"] = {{"format", "pt"},
                                 {"source", "gpt-train"},
                                 {"iteration", std::to_string(meta.iteration)},
                                 {"n_layer", std::to_string(cfg.model.num_layers)},
                                 {"n_embd", std::to_string(cfg.model.hidden_size)},
                                 {"n_head", std::to_string(cfg.model.num_heads)},
                                 {"n_inner", std::to_string(cfg.ffn_hidden())},
                                 {"n_positions", std::to_string(cfg.model.seq_length)},
                                 {"vocab_size", std::to_string(V)},
                                 {"layer_norm_epsilon", fmt::format("{}", cfg.model.layernorm_eps)}};
  int64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = meta.tensors.find(names[i].ours);
    if (it == meta.tensors.end()) throw CheckpointError("convert: checkpoint " + dir + " has no tensor " + names[i].ours);
    ours[i] = it->second;
    theirs[i] = hf_shape(names[i], ours[i]);
    if (names[i].vocab_rows) {
      if (ours[i].size() != 2 || ours[i][0] < V)
        throw CheckpointError("convert: " + names[i].ours + " has shape " + shape_str(ours[i]) + ", fewer rows than the vocabulary");
      theirs[i][0] = V;
    }
    const int64_t bytes = shape_numel(theirs[i]) * 4;
    json_header[names[i].hf] = {{"dtype", "F32"}, {"shape", theirs[i]}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header = json_header.dump();
  while ((8 + header.size()) % 8 != 0) header += ' ';

  const std::string tmp = safetensors_file + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (!out) throw CheckpointError("convert: cannot create " + tmp + ": " + std::strerror(errno));
  auto put = [&](const void* data, size_t bytes) {
    if (std::fwrite(data, 1, bytes, out) != bytes) {
      std::fclose(out);
      throw CheckpointError("convert: cannot write " + tmp + ": " + std::strerror(errno));
    }
  };
  uint8_t len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<uint8_t>(uint64_t(header.size()) >> (8 * b));
  put(len, 8);
  put(header.data(), header.size());
  CheckpointReader reader(dir, meta);
  const std::string kind = meta.master_weights ? "master" : "model";
  for (size_t i = 0; i < names.size(); ++i) {
    const int64_t n = shape_numel(ours[i]);
    std::vector<float> values(n);
    if (reader.read(kind, names[i].ours, ours[i], ShardSpec{}, 0, n, values.data()) != n)
      throw CheckpointError("convert: checkpoint " + dir + " does not hold every element of " + names[i].ours);
    if (names[i].transpose) values = transposed(values, ours[i][0], ours[i][1]);
    put(values.data(), shape_numel(theirs[i]) * 4);  // vocab: the leading real rows
  }
  if (std::fflush(out) != 0 || std::fclose(out) != 0)
    throw CheckpointError("convert: cannot write " + tmp + ": " + std::strerror(errno));
  fsync_path(tmp);
  std::error_code ec;
  fs::rename(tmp, safetensors_file, ec);
  if (ec) throw CheckpointError("convert: cannot rename " + tmp + " to " + safetensors_file + ": " + ec.message());
}

void import_hf_gpt2(const std::string& safetensors_file, const Config& cfg, const std::string& checkpoint_dir) {
  const std::string& file = safetensors_file;
  std::ifstream in(file, std::ios::binary);
  if (!in) throw CheckpointError("convert: cannot open " + file + ": " + std::strerror(errno));
  std::error_code ec;
  const int64_t size = static_cast<int64_t>(fs::file_size(file, ec));
  uint8_t len[8] = {};
  if (ec || size < 8 || !in.read(reinterpret_cast<char*>(len), 8))
    throw CheckpointError("convert: " + file + " is too short to be a safetensors file");
  uint64_t header_len = 0;
  for (int b = 0; b < 8; ++b) header_len |= uint64_t(len[b]) << (8 * b);
  if (header_len > uint64_t(size - 8) || header_len > (100u << 20))
    throw CheckpointError(fmt::format("convert: {}: header length {} does not fit the file ({} bytes): not a safetensors file",
                                      file, header_len, size));
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(header);
  } catch (const nlohmann::json::parse_error& e) {
    throw CheckpointError("convert: " + file + ": the header is not valid JSON (" + json_error_text(e) + ")");
  }
  if (!root.is_object()) throw CheckpointError("convert: " + file + ": the header is not a JSON object");

  struct Entry {
    DType dtype = DType::F32;
    Shape shape;
    int64_t begin = 0, end = 0;
  };
  std::map<std::string, Entry> entries;  // by HF name with the "transformer." prefix
  for (const auto& [key, value] : root.items()) {
    std::string name = key;
    if (name == "__metadata__") continue;
    if (!name.starts_with("transformer.") && name != "lm_head.weight") name = "transformer." + name;
    // The causal-mask buffers of older exports and the tied head carry no weights of their own.
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name == "lm_head.weight") continue;
    Entry e;
    std::string dtype;
    try {
      value.at("dtype").get_to(dtype);
      value.at("shape").get_to(e.shape);
      const auto& offsets = value.at("data_offsets");
      if (offsets.size() != 2) throw std::invalid_argument("data_offsets");
      offsets.at(0).get_to(e.begin);
      offsets.at(1).get_to(e.end);
    } catch (const std::exception&) {
      throw CheckpointError("convert: " + file + ": tensor " + name + " lacks a valid dtype, shape or data_offsets");
    }
    if (dtype == "F32") e.dtype = DType::F32;
    else if (dtype == "F16") e.dtype = DType::F16;
    else if (dtype == "BF16") e.dtype = DType::BF16;
    else throw CheckpointError("convert: " + file + ": tensor " + name + " has dtype " + dtype + " (F32, F16 or BF16 expected)");
    const int64_t elem = e.dtype == DType::F32 ? 4 : 2;
    if (e.begin < 0 || e.end < e.begin || data_start + e.end > size || e.end - e.begin != shape_numel(e.shape) * elem)
      throw CheckpointError(fmt::format("convert: {}: tensor {} has data_offsets [{}, {}] that do not fit its shape {} "
                                        "or the file ({} bytes)",
                                        file, name, e.begin, e.end, shape_str(e.shape), size));
    entries[name] = e;
  }

  const std::vector<TensorMap> names = hf_gpt2_names(cfg.model.num_layers);
  const std::map<std::string, Shape> shapes = our_shapes(cfg);
  for (const TensorMap& t : names) {
    auto it = entries.find(t.hf);
    if (it == entries.end()) throw CheckpointError("convert: " + file + " has no tensor " + t.hf);
    const Shape want = hf_shape(t, shapes.at(t.ours));
    if (it->second.shape != want)
      throw CheckpointError("convert: " + file + ": tensor " + t.hf + " has shape " + shape_str(it->second.shape) +
                            ", the config (" + cfg.source + ") needs " + shape_str(want));
  }
  if (entries.size() != names.size())
    for (const auto& [name, e] : entries)
      if (std::none_of(names.begin(), names.end(), [&](const TensorMap& t) { return t.hf == name; }))
        throw CheckpointError("convert: " + file + ": tensor " + name + " is not part of a GPT-2 model with " +
                              std::to_string(cfg.model.num_layers) + " layers");

  CheckpointMeta meta;
  meta.has_optimizer_state = false;
  meta.dtype = "fp32";
  meta.vocab_size = cfg.model.vocab_size;
  meta.padded_vocab = cfg.model.vocab_size;
  meta.rng_seed = cfg.training.seed;
  meta.tensors = shapes;
  meta.config_yaml = dump_config(cfg);
  const std::string tmp = begin_checkpoint_dir(checkpoint_dir, 0);
  ShardFileWriter writer(tmp + "/" + rank_file_name(0), 0, 0);
  for (const TensorMap& t : names) {
    const Entry& e = entries.at(t.hf);
    std::vector<unsigned char> raw(e.end - e.begin);
    in.seekg(data_start + e.begin);
    if (!in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size())))
      throw CheckpointError("convert: cannot read tensor " + t.hf + " from " + file);
    const int64_t n = shape_numel(e.shape);
    std::vector<float> values(n);
    if (e.dtype == DType::F32) {
      std::memcpy(values.data(), raw.data(), raw.size());
    } else {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(raw.data());
      for (int64_t i = 0; i < n; ++i) values[i] = e.dtype == DType::BF16 ? bf16_to_fp32(h[i]) : fp16_to_fp32(h[i]);
    }
    if (t.transpose) values = transposed(values, e.shape[0], e.shape[1]);
    writer.write("model", t.ours, shapes.at(t.ours), ShardSpec{}, 0, n, values.data(), DType::F32);
  }
  meta.files.push_back(writer.finish());
  commit_checkpoint_dir(checkpoint_dir, meta, 0);
}

int convert_main(const ConvertOptions& args) {
  try {
    if (args.from.ends_with(".safetensors")) {
      Config cfg = load_config(args.config, args.sets);
      import_hf_gpt2(args.from, cfg, args.to);
      std::cout << "imported " << args.from << " into checkpoint " << args.to << "/" << iteration_dir_name(0) << "\n";
    } else {
      export_hf_gpt2(args.from, args.to);
      std::cout << "exported checkpoint " << args.from << " to " << args.to << " (Hugging Face GPT-2 names, F32)\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt-train convert: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace gpt
