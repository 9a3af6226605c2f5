// What a loaded config says about the model and its layout, in the typed forms the layers below app/
// read: the ModelDescription (model/model_description.h) that model/, the memory and time models and the
// planner share; the ModelSpec one rank builds; the planner's LayoutSpec; and the process grid's layout.
// These are the only translations from config keys to those types.
#pragma once
#include "app/config.h"
#include "model/gpt_model.h"
#include "parallel/plan/memory_model.h"
#include "parallel/grid/process_grid.h"

namespace gpt {

// model.* as a ModelDescription (not validated: validate_config() does that, naming the file).
ModelDescription model_description_from_config(const Config& cfg);
// The model this rank builds: the description, its tensor-parallel rank, dtype and recomputation.
ModelSpec model_spec_from_config(const Config& cfg, int tp_size, int tp_rank);
LayoutSpec layout_spec_from_config(const Config& cfg, const GridLayout& layout);
// The layout a config asks for on `world` ranks (parallel.tensor, .pipeline, .data with 0 = derive).
GridLayout grid_layout_from_config(const ParallelConfig& parallel, int world);
DType dtype_from_name(const std::string& name);

}  // namespace gpt
