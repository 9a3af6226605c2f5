// ShardSpec index arithmetic, flat gradient buffers and counter-based parameter initialisation.
#include "model/parameter.h"

#include <stdexcept>

#include "model/init.h"

namespace gpt {

Shape ShardSpec::local_shape(const Shape& global) const {
  if (dim < 0) return global;
  Shape s = global;
  if (s.at(dim) % (int64_t(blocks) * parts) != 0)
    throw std::invalid_argument("ShardSpec: dimension " + std::to_string(dim) + " of " + shape_str(global) +
                                " does not split into " + std::to_string(blocks) + " blocks x " +
                                std::to_string(parts) + " parts");
  s[dim] /= parts;
  return s;
}

int64_t ShardSpec::global_index(const Shape& global, int64_t local) const {
  if (dim < 0) return local;
  Shape ls = local_shape(global);
  // Split the flat index into (outer, coordinate along dim, inner).
  int64_t inner = 1;
  for (size_t d = dim + 1; d < ls.size(); ++d) inner *= ls[d];
  int64_t ld = ls[dim];
  int64_t inner_i = local % inner;
  int64_t coord = (local / inner) % ld;
  int64_t outer = local / (inner * ld);
  int64_t blk_local = ld / blocks;
  int64_t blk_global = global[dim] / blocks;
  int64_t g = (coord / blk_local) * blk_global + int64_t(part) * blk_local + coord % blk_local;
  return (outer * global[dim] + g) * inner + inner_i;
}

Parameter& ParameterSet::add(std::string name, Shape global_shape, ShardSpec shard, bool weight_decay,
                             bool tp_replicated) {
  auto p = std::make_unique<Parameter>();
  p->name = std::move(name);
  p->global_shape = std::move(global_shape);
  p->shard = shard;
  p->weight_decay = weight_decay;
  p->tp_replicated = tp_replicated;
  params_.push_back(std::move(p));
  return *params_.back();
}

void ParameterSet::allocate(Backend& backend, DType dtype, int64_t pad_multiple) {
  int64_t total = 0;
  for (auto& p : params_) total += shape_numel(p->shard.local_shape(p->global_shape));
  total = (total + pad_multiple - 1) / pad_multiple * pad_multiple;
  grad_buffer_ = backend.zeros({total}, DType::F32);
  value_buffer_ = backend.zeros({total}, dtype);
  int64_t offset = 0;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    Parameter& p = **it;
    Shape ls = p.shard.local_shape(p.global_shape);
    p.value = value_buffer_.slice_elems(offset, ls);
    p.grad = grad_buffer_.slice_elems(offset, ls);
    offset += shape_numel(ls);
  }
}

int64_t ParameterSet::offset_of(const Parameter& p) const {
  return (static_cast<const char*>(p.grad.raw()) - static_cast<const char*>(grad_buffer_.raw())) / 4;
}

std::vector<Parameter*> ParameterSet::all() {
  std::vector<Parameter*> out;
  for (auto& p : params_) out.push_back(p.get());
  return out;
}

void ParameterSet::zero_grad(Backend& backend) {
  if (grad_buffer_.defined()) backend.fill(grad_buffer_, 0.f);
}

void init_parameter(Backend& backend, Parameter& p, uint64_t seed) {
  const InitRule& rule = p.init;
  std::vector<float> host(p.value.numel());
  if (rule.normal) {
    uint64_t h = hash_name(p.name);
    for (int64_t i = 0; i < (int64_t)host.size(); ++i)
      host[i] = rule.std * counter_normal(seed, h, p.shard.global_index(p.global_shape, i));
  } else {
    std::fill(host.begin(), host.end(), rule.constant);
  }
  backend.upload(host.data(), p.value);
}

}  // namespace gpt
