// The smallest model the single-process training tests share: 2 layers, hidden 32, 2 heads, sequence 16,
// vocabulary 32, two microbatches of 4 per step on a repeating synthetic pattern (so the loss falls within
// a few dozen steps). Tests set the schedule and the step count they need on top.
#pragma once
#include <string>

#include "app/config.h"

namespace gpt {

inline Config tiny_model_config(const std::string& dtype = "fp32") {
  Config cfg;
  cfg.model.num_layers = 2;
  cfg.model.hidden_size = 32;
  cfg.model.num_heads = 2;
  cfg.model.seq_length = 16;
  cfg.model.vocab_size = 32;
  cfg.training.micro_batch_size = 4;
  cfg.training.global_batch_size = 8;
  cfg.data.synthetic = "pattern";
  cfg.precision.dtype = dtype;
  cfg.logging.interval = 1000;
  return cfg;
}

}  // namespace gpt
