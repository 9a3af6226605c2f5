// The table-driven export and import that the Hugging Face conversions share (app/convert_tensors.h).
#include "app/convert_tensors.h"

#include <algorithm>
#include <fmt/format.h>

#include "app/config_model.h"

namespace gpt {

namespace {

// The part of our tensor (global shape `ours`) that the HF tensor holds, as a flat element range, and the
// HF tensor's shape.
struct Cut {
  int64_t begin = 0, end = 0;
  Shape hf_shape;
};

Cut cut_of(const TensorMap& t, const Shape& ours) {
  Cut c{0, shape_numel(ours), ours};
  if (t.rows > 0) {
    const int64_t cols = ours.size() == 2 ? ours[1] : 0;
    if (ours.size() != 2 || t.row_begin + t.rows > ours[0])
      throw CheckpointError(fmt::format("tensor {} has shape {}: it has no rows [{}, {}) for {}", t.ours, shape_str(ours),
                                        t.row_begin, t.row_begin + t.rows, t.hf));
    c = {t.row_begin * cols, (t.row_begin + t.rows) * cols, {t.rows, cols}};
  }
  if (t.transpose) c.hf_shape = {c.hf_shape.at(1), c.hf_shape.at(0)};
  return c;
}

// [rows, cols] -> [cols, rows].
std::vector<float> transposed(const std::vector<float>& in, int64_t rows, int64_t cols) {
  std::vector<float> out(in.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * cols + j];
  return out;
}

}  // namespace

std::map<std::string, Shape> unpadded_tensor_shapes(const ModelDescription& m) {
  const int64_t C = m.hidden, F = m.ffn, V = m.vocab_size;
  std::map<std::string, Shape> s = {{"embedding.word_embeddings.weight", {V, C}}, {"final_ln.weight", {C}}};
  if (m.has_position_table()) s["embedding.position_embeddings.weight"] = {m.seq_length, C};
  if (m.has_norm_bias()) s["final_ln.bias"] = {C};
  if (m.untie_embeddings) s["output_layer.weight"] = {V, C};
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    s[p + "ln1.weight"] = s[p + "ln2.weight"] = {C};
    if (m.has_norm_bias()) s[p + "ln1.bias"] = s[p + "ln2.bias"] = {C};
    s[p + "attention.qkv.weight"] = {m.qkv_width(), C};
    s[p + "attention.proj.weight"] = {C, C};
    s[p + "mlp.fc1.weight"] = {m.fc1_width(), C};
    s[p + "mlp.fc2.weight"] = {C, F};
    if (m.add_bias_linear) {
      s[p + "attention.qkv.bias"] = {m.qkv_width()};
      s[p + "attention.proj.bias"] = {C};
      s[p + "mlp.fc1.bias"] = {m.fc1_width()};
      s[p + "mlp.fc2.bias"] = {C};
    }
  }
  return s;
}

void refuse_inexpressible(const std::string& format, const std::string& where, const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::string list;
  for (const std::string& p : problems) list += "\n  " + p;
  throw CheckpointError(fmt::format("{}: {} cannot express this model:{}", where, format, list));
}

ExportSource open_checkpoint_for_export(const std::string& checkpoint) {
  ExportSource src;
  src.dir = resolve_checkpoint(checkpoint);
  if (src.dir.empty()) throw CheckpointError(checkpoint + " holds no checkpoint (no metadata.yaml, no latest)");
  const std::string index = src.dir + "/" + kMetadataFile;
  src.meta = checkpoint_meta_from_yaml(read_text_file(index), index);
  try {
    src.cfg = load_config_string(src.meta.config_yaml, index + " (config)");
  } catch (const std::exception& e) {
    throw CheckpointError(std::string("the config stored in the checkpoint is not usable: ") + e.what());
  }
  return src;
}

void export_tensors(const ExportSource& src, const std::vector<TensorMap>& maps,
                    const std::vector<std::pair<std::string, std::string>>& metadata, const std::string& file) {
  std::vector<SafetensorsTensor> out;
  std::vector<Cut> cuts;
  for (const TensorMap& t : maps) {
    auto it = src.meta.tensors.find(t.ours);
    if (it == src.meta.tensors.end()) throw CheckpointError("checkpoint " + src.dir + " has no tensor " + t.ours);
    cuts.push_back(cut_of(t, it->second));
    out.push_back({t.hf, cuts.back().hf_shape});
  }
  CheckpointReader reader(src.dir, src.meta);
  const std::string kind = src.meta.master_weights ? "master" : "model";
  write_safetensors(file, metadata, out, [&](size_t i, float* values) {
    const TensorMap& t = maps[i];
    const Cut& c = cuts[i];
    if (reader.read(kind, t.ours, src.meta.tensors.at(t.ours), ShardSpec{}, c.begin, c.end, values) != c.end - c.begin)
      throw CheckpointError("checkpoint " + src.dir + " does not hold every element of " + t.ours);
    if (t.transpose) {
      const int64_t rows = c.hf_shape[1], cols = c.hf_shape[0];  // ours
      std::vector<float> v(values, values + rows * cols);
      v = transposed(v, rows, cols);
      std::copy(v.begin(), v.end(), values);
    }
  });
}

void import_tensors(SafetensorsReader& in, const std::vector<TensorMap>& maps, const Config& cfg,
                    const std::function<std::string(const std::string&)>& hf_name, const std::string& shapes_from,
                    const std::string& model, const std::string& checkpoint_dir) {
  std::map<std::string, std::string> stored;  // the map's name -> the file's name
  for (const auto& [name, entry] : in.tensors()) {
    const std::string n = hf_name(name);
    if (n.empty()) continue;
    if (std::none_of(maps.begin(), maps.end(), [&](const TensorMap& t) { return t.hf == n; }))
      throw CheckpointError(in.file_of(name) + ": tensor " + name + " is not part of " + model);
    stored[n] = name;
  }
  const ModelDescription desc = model_description_from_config(cfg);
  const std::map<std::string, Shape> shapes = unpadded_tensor_shapes(desc);
  std::vector<Cut> cuts;
  for (const TensorMap& t : maps) {
    auto it = stored.find(t.hf);
    if (it == stored.end()) throw CheckpointError(in.path() + " has no tensor " + t.hf + " (" + model + ")");
    cuts.push_back(cut_of(t, shapes.at(t.ours)));
    const Shape& got = in.tensors().at(it->second).shape;
    if (got != cuts.back().hf_shape)
      throw CheckpointError(in.file_of(it->second) + ": tensor " + it->second + " has shape " + shape_str(got) + ", " +
                            shapes_from + " needs " + shape_str(cuts.back().hf_shape));
  }

  CheckpointMeta meta;
  meta.has_optimizer_state = false;
  meta.dtype = "fp32";
  meta.vocab_size = desc.vocab_size;
  meta.padded_vocab = desc.vocab_size;
  meta.rng_seed = cfg.training.seed;
  meta.tensors = shapes;
  meta.config_yaml = dump_config(cfg);
  const std::string tmp = begin_checkpoint_dir(checkpoint_dir, 0);
  ShardFileWriter writer(tmp + "/" + rank_file_name(0), 0, 0);
  // A rank file holds one piece per tensor: each of ours is assembled from its HF parts, then written.
  std::map<std::string, std::vector<float>> assembling;
  for (size_t i = 0; i < maps.size(); ++i) {
    const TensorMap& t = maps[i];
    const Shape& shape = shapes.at(t.ours);
    std::vector<float>& ours = assembling[t.ours];
    ours.resize(shape_numel(shape));
    std::vector<float> values = in.read_f32(stored.at(t.hf));
    if (t.transpose) values = transposed(values, cuts[i].hf_shape[0], cuts[i].hf_shape[1]);
    std::copy(values.begin(), values.end(), ours.begin() + cuts[i].begin);
    const bool last_part = std::none_of(maps.begin() + i + 1, maps.end(), [&](const TensorMap& m) { return m.ours == t.ours; });
    if (!last_part) continue;
    writer.write("model", t.ours, shape, ShardSpec{}, 0, shape_numel(shape), ours.data(), DType::F32);
    assembling.erase(t.ours);
  }
  meta.files.push_back(writer.finish());
  commit_checkpoint_dir(checkpoint_dir, meta, 0);
}

}  // namespace gpt
