// What the Hugging Face conversions share (app/convert.cpp: GPT-2, app/convert_llama.cpp: Llama): a table
// of TensorMaps says which part of which of our global tensors each Hugging Face tensor is; export and
// import walk that table one tensor at a time in either direction, so both directions are the same table.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "app/config.h"
#include "app/safetensors.h"
#include "model/model_description.h"
#include "parallel/checkpoint/checkpoint_format.h"

namespace gpt {

// One Hugging Face tensor: rows [row_begin, row_begin + rows) of our 2-D tensor `ours` (rows 0: all of
// it), transposed when HF stores the matrix the other way round (GPT-2's Conv1D keeps [in, out] where
// our linears keep [out, in]).
struct TensorMap {
  std::string ours, hf;
  bool transpose = false;
  int64_t row_begin = 0, rows = 0;
};

// Our global tensors of model `m` with the real vocabulary rows only: what an import stores (any layout
// pads the vocabulary when it loads).
std::map<std::string, Shape> unpadded_tensor_shapes(const ModelDescription& m);

// Throws a CheckpointError listing `problems` (one "model.key is value (why)" each) when there are any:
// the model keys whose values `format` cannot express.
void refuse_inexpressible(const std::string& format, const std::string& where, const std::vector<std::string>& problems);

// A checkpoint opened for export: its directory, index and stored config.
struct ExportSource {
  std::string dir;
  CheckpointMeta meta;
  Config cfg;
};
ExportSource open_checkpoint_for_export(const std::string& checkpoint);

// Writes the tensors of `maps`, cut from the checkpoint's global fp32 weights (the master copies where it
// has them), as one F32 safetensors file.
void export_tensors(const ExportSource& src, const std::vector<TensorMap>& maps,
                    const std::vector<std::pair<std::string, std::string>>& metadata, const std::string& file);

// Writes checkpoint `checkpoint_dir` (iteration 0, weights only) of the model `cfg` describes from the
// tensors of `maps` in `in`. `hf_name` gives the map's name of a tensor in the file, or "" for one to skip
// (buffers with no weights of their own). `shapes_from` names what fixed the architecture and `model` the
// model, in errors: a missing, misshapen or unknown tensor stops the import, naming it.
void import_tensors(SafetensorsReader& in, const std::vector<TensorMap>& maps, const Config& cfg,
                    const std::function<std::string(const std::string&)>& hf_name, const std::string& shapes_from,
                    const std::string& model, const std::string& checkpoint_dir);

}  // namespace gpt
