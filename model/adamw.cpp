// AdamW optimizer over the backend's fused adamw_step kernel.
#include "model/adamw.h"

namespace gpt {

AdamW::AdamW(Backend& backend, std::vector<Parameter*> params, AdamWConfig cfg) : backend_(backend), cfg_(cfg) {
  for (Parameter* p : params) {
    State s{p, p->value, backend.zeros(p->value.shape()), backend.zeros(p->value.shape())};
    if (p->value.dtype() != DType::F32) {
      s.master = backend.empty(p->value.shape(), DType::F32);
      backend.copy(p->value, s.master);
    }
    states_.push_back(s);
  }
}

void AdamW::step(float lr) {
  ++step_;
  for (State& s : states_) {
    float wd = s.param->weight_decay ? cfg_.weight_decay : 0.f;
    backend_.adamw_step(s.master, s.param->grad, s.m, s.v, lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, step_);
    if (s.master.raw() != s.param->value.raw()) backend_.copy(s.master, s.param->value);
  }
}

}  // namespace gpt
