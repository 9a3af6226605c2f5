// AdamW with decoupled weight decay on fp32 master weights. When the compute dtype is fp32 the master
// weights are the parameters themselves; otherwise the optimizer keeps an fp32 copy and casts it back to
// the compute dtype after every step. Biases and layernorm parameters have weight_decay = false.
#pragma once
#include <vector>

#include "model/parameter.h"

namespace gpt {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};

class AdamW {
 public:
  AdamW(Backend& backend, std::vector<Parameter*> params, AdamWConfig cfg);
  // One update with learning rate `lr`, using each parameter's (already reduced and clipped) gradient.
  void step(float lr);
  int64_t steps_taken() const { return step_; }
  struct State {
    Parameter* param;
    Tensor master, m, v;  // master is param->value when the compute dtype is fp32
  };
  std::vector<State>& states() { return states_; }

 private:
  Backend& backend_;
  AdamWConfig cfg_;
  std::vector<State> states_;
  int64_t step_ = 0;
};

}  // namespace gpt
