// Config keys to the typed model and layout descriptions (see app/config_model.h).
#include "app/config_model.h"

#include <climits>

namespace gpt {

ModelDescription model_description_from_config(const Config& cfg) {
  const ModelConfig& c = cfg.model;
  ModelDescription m;
  m.num_layers = c.num_layers;
  m.hidden = c.hidden_size;
  m.heads = c.num_heads;
  m.ffn = cfg.ffn_hidden();
  m.seq_length = c.seq_length;
  m.vocab_size = c.vocab_size;
  m.vocab_divisible_by = c.make_vocab_size_divisible_by;
  m.eps = static_cast<float>(c.layernorm_eps);
  m.init_std = static_cast<float>(c.init_std);
  m.position = parse_position_embedding(c.position_embedding_type);
  m.rotary_base = c.rotary_base;
  m.rotary_percent = c.rotary_percent;
  m.normalization = parse_normalization(c.normalization);
  m.swiglu = c.swiglu;
  m.num_query_groups = c.num_query_groups;
  m.untie_embeddings = c.untie_embeddings_and_output_weights;
  m.add_bias_linear = c.add_bias_linear;
  return m;
}

DType dtype_from_name(const std::string& name) {
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "fp16") return DType::F16;
  throw ConfigError("precision.dtype: unknown dtype '" + name + "'");
}

ModelSpec model_spec_from_config(const Config& cfg, int tp_size, int tp_rank) {
  ModelSpec s;
  static_cast<ModelDescription&>(s) = model_description_from_config(cfg);
  s.tp_size = tp_size;
  s.tp_rank = tp_rank;
  s.padded_vocab_rows = s.padded_vocab(tp_size);
  s.dtype = dtype_from_name(cfg.precision.dtype);
  s.recompute = parse_recompute(cfg.training.recompute);
  try {
    s.fp8 = parse_fp8_recipe(cfg.precision.fp8, cfg.precision.fp8_amax_compute_algo,
                             cfg.precision.fp8_amax_history_len, cfg.precision.fp8_margin);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  return s;
}

LayoutSpec layout_spec_from_config(const Config& cfg, const GridLayout& grid) {
  LayoutSpec l;
  l.tp = grid.tp();
  l.pp = grid.pp();
  l.dp = grid.dp();
  l.cp = grid.cp();
  l.vpp = static_cast<int>(cfg.parallel.virtual_pipeline);
  l.micro_batch = cfg.training.micro_batch_size;
  l.global_batch = cfg.training.global_batch_size;
  l.sequence_parallel = cfg.parallel.sequence_parallel;
  l.tp_comm_overlap = cfg.parallel.tp_comm_overlap;
  l.distributed_optimizer = cfg.parallel.distributed_optimizer;
  l.recompute = parse_recompute(cfg.training.recompute);
  l.dtype = dtype_from_name(cfg.precision.dtype);
  l.checkpoint_snapshot = cfg.checkpoint.async_save && !cfg.checkpoint.dir.empty();
  l.snapshot_optimizer_state = cfg.checkpoint.save_optimizer;
  return l;
}

GridLayout grid_layout_from_config(const ParallelConfig& parallel, int world) {
  auto narrow = [](const char* key, int64_t v) {
    if (v < INT_MIN || v > INT_MAX) throw GridError(std::string(key) + " = " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
  };
  const int tp = narrow("parallel.tensor", parallel.tensor), pp = narrow("parallel.pipeline", parallel.pipeline);
  const int dp = narrow("parallel.data", parallel.data), cp = narrow("parallel.context", parallel.context);
  try {
    return GridLayout(world, tp, pp, dp, cp);
  } catch (const GridError& e) {
    throw GridError(std::string(e.what()) +
                    " (the config's parallel.tensor, parallel.pipeline, parallel.context and parallel.data; "
                    "parallel.data 0 derives it from the world size)");
  }
}

}  // namespace gpt
