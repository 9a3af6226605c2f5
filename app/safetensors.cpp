// Safetensors reading and writing (see app/safetensors.h); the JSON is nlohmann-json's.
#include "app/safetensors.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "data/json_lines.h"
#include "model/ops/half.h"
#include "parallel/checkpoint/checkpoint_format.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw CheckpointError(what + " is not valid JSON (" + json_error_text(e) + ")");
  }
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  if (!path.ends_with(".json")) {
    tensors_ = read_header(path);
    return;
  }
  // A sharded model: the index maps every tensor to the file beside it that holds it.
  const nlohmann::json index = parse_json(read_text_file(path), path);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw CheckpointError(path + ": no \"weight_map\" object of tensor names to files");
  std::map<std::string, std::map<std::string, SafetensorsEntry>> shards;
  const fs::path dir = fs::path(path).parent_path();
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) throw CheckpointError(path + ": weight_map[\"" + name + "\"] is not a file name");
    const std::string shard = (dir / file.get<std::string>()).string();
    if (!shards.count(shard)) shards[shard] = read_header(shard);
    auto it = shards[shard].find(name);
    if (it == shards[shard].end())
      throw CheckpointError(path + " places tensor " + name + " in " + shard + ", which does not hold it");
    tensors_[name] = it->second;
  }
}

std::map<std::string, SafetensorsEntry> SafetensorsReader::read_header(const std::string& file) {
  auto in = std::make_unique<std::ifstream>(file, std::ios::binary);
  if (!*in) throw CheckpointError("cannot open " + file + ": " + std::strerror(errno));
  std::error_code ec;
  const int64_t size = static_cast<int64_t>(fs::file_size(file, ec));
  uint8_t len[8] = {};
  if (ec || size < 8 || !in->read(reinterpret_cast<char*>(len), 8))
    throw CheckpointError(file + " is too short to be a safetensors file");
  uint64_t header_len = 0;
  for (int b = 0; b < 8; ++b) header_len |= uint64_t(len[b]) << (8 * b);
  if (header_len > uint64_t(size - 8) || header_len > (100u << 20))
    throw CheckpointError(fmt::format("{}: header length {} does not fit the file ({} bytes): not a safetensors file",
                                      file, header_len, size));
  std::string header(header_len, '\0');
  in->read(header.data(), static_cast<std::streamsize>(header_len));
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  const nlohmann::json root = parse_json(header, file + ": the header");
  if (!root.is_object()) throw CheckpointError(file + ": the header is not a JSON object");

  std::map<std::string, SafetensorsEntry> entries;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") continue;
    SafetensorsEntry e;
    e.file = files_.size();
    std::string dtype;
    try {
      value.at("dtype").get_to(dtype);
      value.at("shape").get_to(e.shape);
      const auto& offsets = value.at("data_offsets");
      if (offsets.size() != 2) throw std::invalid_argument("data_offsets");
      offsets.at(0).get_to(e.begin);
      offsets.at(1).get_to(e.end);
    } catch (const std::exception&) {
      throw CheckpointError(file + ": tensor " + name + " lacks a valid dtype, shape or data_offsets");
    }
    if (dtype == "F32") e.dtype = DType::F32;
    else if (dtype == "F16") e.dtype = DType::F16;
    else if (dtype == "BF16") e.dtype = DType::BF16;
    else throw CheckpointError(file + ": tensor " + name + " has dtype " + dtype + " (F32, F16 or BF16 expected)");
    const int64_t elem = e.dtype == DType::F32 ? 4 : 2;
    if (e.begin < 0 || e.end < e.begin || data_start + e.end > size || e.end - e.begin != shape_numel(e.shape) * elem)
      throw CheckpointError(fmt::format("{}: tensor {} has data_offsets [{}, {}] that do not fit its shape {} "
                                        "or the file ({} bytes)",
                                        file, name, e.begin, e.end, shape_str(e.shape), size));
    entries[name] = e;
  }
  files_.push_back({file, std::move(in), data_start});
  return entries;
}

std::vector<float> SafetensorsReader::read_f32(const std::string& name) {
  const SafetensorsEntry& e = tensors_.at(name);
  File& f = files_.at(e.file);
  std::vector<unsigned char> raw(e.end - e.begin);
  f.in->seekg(f.data_start + e.begin);
  if (!f.in->read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size())))
    throw CheckpointError("cannot read tensor " + name + " from " + f.path);
  const int64_t n = shape_numel(e.shape);
  std::vector<float> values(n);
  if (e.dtype == DType::F32) {
    std::memcpy(values.data(), raw.data(), raw.size());
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(raw.data());
    for (int64_t i = 0; i < n; ++i) values[i] = e.dtype == DType::BF16 ? bf16_to_fp32(h[i]) : fp16_to_fp32(h[i]);
  }
  return values;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, std::string>>& metadata,
                       const std::vector<SafetensorsTensor>& tensors,
                       const std::function<void(size_t, float*)>& fill) {
  nlohmann::ordered_json json_header;
  json_header["__metadata__"] = nlohmann::ordered_json::object();
  for (const auto& [key, value] : metadata) json_header["__metadata__"][key] = value;
  int64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    const int64_t bytes = shape_numel(t.shape) * 4;
    json_header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header = json_header.dump();
  while ((8 + header.size()) % 8 != 0) header += ' ';

  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (!out) throw CheckpointError("cannot create " + tmp + ": " + std::strerror(errno));
  auto put = [&](const void* data, size_t bytes) {
    if (std::fwrite(data, 1, bytes, out) != bytes) {
      std::fclose(out);
      throw CheckpointError("cannot write " + tmp + ": " + std::strerror(errno));
    }
  };
  uint8_t len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<uint8_t>(uint64_t(header.size()) >> (8 * b));
  put(len, 8);
  put(header.data(), header.size());
  std::vector<float> values;
  for (size_t i = 0; i < tensors.size(); ++i) {
    values.assign(shape_numel(tensors[i].shape), 0.f);
    try {
      fill(i, values.data());
    } catch (...) {
      std::fclose(out);
      throw;
    }
    put(values.data(), values.size() * 4);
  }
  if (std::fflush(out) != 0 || std::fclose(out) != 0)
    throw CheckpointError("cannot write " + tmp + ": " + std::strerror(errno));
  fsync_path(tmp);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw CheckpointError("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

}  // namespace gpt
