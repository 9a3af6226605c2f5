// AdamW optimizer over the backend's fused adamw_step kernel.
#include "model/adamw.h"

namespace gpt {

void AdamW::add_segment(Parameter* p, Tensor value, Tensor grad) {
  OptimizerSegment s{p, value, grad, value, backend_.zeros(value.shape()), backend_.zeros(value.shape())};
  if (value.dtype() != DType::F32) {
    s.master = backend_.empty(value.shape(), DType::F32);
    backend_.copy(value, s.master);
  }
  segments_.push_back(s);
}

void AdamW::step(float lr) {
  ++step_;
  for (OptimizerSegment& s : segments_) {
    float wd = s.param->weight_decay ? cfg_.weight_decay : 0.f;
    backend_.adamw_step(s.master, s.grad, s.m, s.v, lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, step_);
    if (s.master.raw() != s.value.raw()) backend_.copy(s.master, s.value);
  }
}

}  // namespace gpt
