// AdamW with decoupled weight decay on fp32 master weights, over "segments": contiguous pieces of
// parameters, each with its value, gradient and optimizer state. Without a distributed optimizer every
// parameter is one segment; with ZeRO-1 a segment is the part of a parameter that falls in this
// data-parallel rank's shard of the flat buffers (parallel/distributed_optimizer.h). When the compute
// dtype is fp32 the master weights are the values themselves; otherwise the optimizer keeps an fp32 copy
// and casts it back after every step. Biases and layernorm parameters get no weight decay.
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
  Tensor master, m, v;         // fp32 optimizer state for those elements
};

class AdamW {
 public:
  AdamW(Backend& backend, AdamWConfig cfg) : backend_(backend), cfg_(cfg) {}
  // Registers elements of `p`: value and grad are views of equal length.
  void add_segment(Parameter* p, Tensor value, Tensor grad);
  // One update with learning rate `lr`, using the segments' (already reduced and clipped) gradients.
  void step(float lr);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  std::vector<OptimizerSegment>& segments() { return segments_; }

 private:
  Backend& backend_;
  AdamWConfig cfg_;
  std::vector<OptimizerSegment> segments_;
  int64_t step_ = 0;
};

}  // namespace gpt
