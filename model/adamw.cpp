// AdamW over flat ranges, one backend adamw_step_flat call per range.
#include "model/adamw.h"

#include <stdexcept>

namespace gpt {

void AdamW::add_range(Tensor value, Tensor grad, const std::vector<Piece>& pieces) {
  const int64_t n = value.numel();
  if (grad.numel() != n) throw std::invalid_argument("AdamW::add_range: value and grad differ in length");
  OptimizerRange r;
  r.value = value;
  r.grad = grad;
  r.m = backend_.zeros({n});
  r.v = backend_.zeros({n});
  r.master = value;
  if (value.dtype() != DType::F32) {
    r.master = backend_.empty({n}, DType::F32);
    backend_.copy(value, r.master);
  }
  r.first_segment = segments_.size();
  int64_t offset = 0;
  for (const Piece& p : pieces) {
    const float decay = p.param->weight_decay ? cfg_.weight_decay : 0.f;
    r.segments.push_back({offset, offset + p.length, decay, -1});
    auto view = [&](const Tensor& t) { return t.slice_elems(offset, {p.length}); };
    segments_.push_back({p.param, view(value), view(grad), view(r.master), view(r.m), view(r.v)});
    offset += p.length;
  }
  if (offset != n) throw std::invalid_argument("AdamW::add_range: the pieces do not cover the range");
  ranges_.push_back(std::move(r));
}

void AdamW::step(float lr, float grad_scale) {
  ++step_;
  const ops::AdamWHyper h{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, grad_scale, step_};
  for (OptimizerRange& r : ranges_) {
    Tensor* value = r.master.raw() != r.value.raw() ? &r.value : nullptr;
    backend_.adamw_step_flat(r.master, r.grad, r.m, r.v, value, r.segments, h);
  }
}

}  // namespace gpt
