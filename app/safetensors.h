// Hugging Face safetensors files: an 8-byte little-endian header length, a JSON header
// {"__metadata__": {...}, name: {dtype, shape, data_offsets}, ...} padded with spaces to a multiple of 8
// bytes, then the raw little-endian tensors back to back. Both directions go one tensor at a time, so
// converting needs memory for the largest tensor only. Errors are CheckpointErrors naming the file and
// the tensor.
#pragma once
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/tensor.h"

namespace gpt {

struct SafetensorsEntry {
  DType dtype = DType::F32;  // F32, F16 or BF16 (other dtypes are refused when the header is read)
  Shape shape;
  int64_t begin = 0, end = 0;  // byte range after the header
  size_t file = 0;             // which file of the set
};

// One safetensors file, or the shards that a model.safetensors.index.json ({"weight_map": {tensor:
// file}}) names beside it, read as one set of tensors.
class SafetensorsReader {
 public:
  // `path`: FILE.safetensors, or an index .json. Reads and checks every header (offsets inside the file,
  // sizes matching shapes and dtypes; in an index, every tensor in the shard it names).
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  // The file that holds `name` (for messages).
  const std::string& file_of(const std::string& name) const { return files_.at(tensors_.at(name).file).path; }
  // Tensor `name` as fp32 (F16 and BF16 widen exactly).
  std::vector<float> read_f32(const std::string& name);

 private:
  struct File {
    std::string path;
    std::unique_ptr<std::ifstream> in;
    int64_t data_start = 0;
  };
  std::map<std::string, SafetensorsEntry> read_header(const std::string& path);
  std::string path_;
  std::vector<File> files_;
  std::map<std::string, SafetensorsEntry> tensors_;
};

struct SafetensorsTensor {
  std::string name;
  Shape shape;
};

// Writes `tensors` as F32 to `path` atomically (path.tmp, fsync, rename). The header comes first, so
// every shape is known before any value: `fill(i, out)` then writes tensor i's values into `out`.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, std::string>>& metadata,
                       const std::vector<SafetensorsTensor>& tensors,
                       const std::function<void(size_t, float*)>& fill);

}  // namespace gpt
