// AdamW with decoupled weight decay on fp32 master weights, over flat ranges of the parameter buffers.
// A range is a contiguous run of a model chunk's flat value and gradient buffers: the whole buffer without
// a distributed optimizer, this data-parallel rank's shard of it with ZeRO-1
// (parallel/data_parallel/data_parallel.h). Each range owns flat fp32 moments (and, when the compute dtype is not fp32,
// flat fp32 master weights that are rounded back into the values by the update itself), so a step is one
// backend call per range (Backend::adamw_step_flat) whatever the number of parameters in it. The
// parameters' pieces of a range are its segments: views of the same elements of every buffer, for the
// checkpoint and the gradient norm, each with its weight decay (none for biases and layernorm parameters).
#pragma once
#include <vector>

#include "model/parameter.h"

namespace gpt {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};

struct OptimizerSegment {
  Parameter* param = nullptr;  // the parameter the segment belongs to (flags, global id)
  Tensor value, grad;          // views of the same elements of the value and gradient buffers
  Tensor master, m, v;         // fp32 optimizer state for those elements (views of the range's flat state)
};

// One flat range and its optimizer state; `segments` are offsets into these tensors.
struct OptimizerRange {
  Tensor value, grad;   // views of the chunk's buffers
  Tensor master, m, v;  // fp32 state of the same length; master aliases value when the values are fp32
  std::vector<ops::FlatSegment> segments;
  size_t first_segment = 0;  // index of the range's first OptimizerSegment in AdamW::segments()
};

class AdamW {
 public:
  AdamW(Backend& backend, AdamWConfig cfg) : backend_(backend), cfg_(cfg) {}
  // One piece of a range: `length` consecutive elements of parameter `param`.
  struct Piece {
    Parameter* param;
    int64_t length;
  };
  // Registers a flat range: value and grad are views of equal length, covered exactly by the pieces in
  // order. Allocates the range's moments (zero) and master weights (a copy of the values).
  void add_range(Tensor value, Tensor grad, const std::vector<Piece>& pieces);
  // One update with learning rate `lr`, every gradient multiplied by `grad_scale` first (1 / loss scale,
  // times the clipping factor).
  void step(float lr, float grad_scale = 1.f);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  std::vector<OptimizerSegment>& segments() { return segments_; }
  std::vector<OptimizerRange>& ranges() { return ranges_; }

 private:
  Backend& backend_;
  AdamWConfig cfg_;
  std::vector<OptimizerRange> ranges_;
  std::vector<OptimizerSegment> segments_;
  int64_t step_ = 0;
};

}  // namespace gpt
