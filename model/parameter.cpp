// ShardSpec index arithmetic, flat gradient buffers and counter-based parameter initialisation.
#include "model/parameter.h"

#include <climits>
#include <memory>
#include <stdexcept>

#include "model/init.h"

namespace gpt {

int64_t ShardSpec::weight_sum() const {
  if (block_weights.empty()) return blocks;
  int64_t sum = 0;
  for (int64_t w : block_weights) sum += w;
  return sum;
}

std::vector<int64_t> ShardSpec::to_ints() const {
  std::vector<int64_t> v{dim, blocks, parts, part};
  v.insert(v.end(), block_weights.begin(), block_weights.end());
  return v;
}

ShardSpec ShardSpec::from_ints(const std::vector<int64_t>& v) {
  auto fits = [](int64_t x) { return x >= 0 && x <= INT32_MAX; };
  if (v.size() < 4 || v[0] < -1 || !fits(v[0] + 1) || v[1] < 1 || !fits(v[1]) || v[2] < 1 || !fits(v[2]) ||
      v[3] < 0 || v[3] >= v[2])
    throw std::invalid_argument("not a valid [dim, blocks, parts, part(, block weights)]");
  ShardSpec s{static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]), static_cast<int>(v[3])};
  if (v.size() == 4) return s;
  if (v.size() != 4 + static_cast<size_t>(s.blocks))
    throw std::invalid_argument("has " + std::to_string(v.size() - 4) + " block weights for " +
                                std::to_string(s.blocks) + " blocks");
  int64_t sum = 0;
  for (size_t i = 4; i < v.size(); ++i) {
    if (v[i] < 1 || v[i] > INT32_MAX) throw std::invalid_argument("has a block weight that is not positive");
    s.block_weights.push_back(v[i]);
    sum += v[i];  // at most 2^31 weights of at most 2^31: no overflow
  }
  int64_t units = 0;
  if (__builtin_mul_overflow(sum, static_cast<int64_t>(s.parts), &units))
    throw std::invalid_argument("has block weights whose sum times the parts overflows");
  return s;
}

Shape ShardSpec::local_shape(const Shape& global) const {
  if (dim < 0) return global;
  if (!block_weights.empty() && static_cast<int>(block_weights.size()) != blocks)
    throw std::invalid_argument("ShardSpec: " + std::to_string(block_weights.size()) + " block weights for " +
                                std::to_string(blocks) + " blocks");
  Shape s = global;
  if (s.at(dim) % (weight_sum() * parts) != 0)
    throw std::invalid_argument("ShardSpec: dimension " + std::to_string(dim) + " of " + shape_str(global) +
                                " does not split into " + std::to_string(blocks) + " blocks (" +
                                std::to_string(weight_sum()) + " units) x " + std::to_string(parts) + " parts");
  s[dim] /= parts;
  return s;
}

int64_t ShardSpec::global_index(const Shape& global, int64_t local) const {
  return ShardIndexMap(*this, global)(local);
}

ShardIndexMap::ShardIndexMap(const ShardSpec& shard, const Shape& global) : whole_(shard.dim < 0) {
  if (whole_) return;
  const Shape ls = shard.local_shape(global);
  for (size_t d = shard.dim + 1; d < ls.size(); ++d) inner_ *= ls[d];
  local_dim_ = ls[shard.dim];
  global_dim_ = global[shard.dim];
  const int64_t unit_local = local_dim_ / shard.weight_sum(), unit_global = global_dim_ / shard.weight_sum();
  int64_t l = 0, g = 0;
  for (int b = 0; b < shard.blocks; ++b) {
    const int64_t w = shard.block_weight(b);
    local_start_.push_back(l);
    global_start_.push_back(g);
    part_offset_.push_back(int64_t(shard.part) * w * unit_local);
    l += w * unit_local;
    g += w * unit_global;
  }
  local_start_.push_back(l);
  if (shard.block_weights.empty()) equal_block_local_ = unit_local;
}

int ShardIndexMap::block_of(int64_t coord) const {
  if (equal_block_local_ > 0) return static_cast<int>(coord / equal_block_local_);
  int b = 0;
  while (coord >= local_start_[b + 1]) ++b;
  return b;
}

int64_t ShardIndexMap::block_end(int64_t coord) const {
  if (whole_) return local_dim_;
  return local_start_[block_of(coord) + 1];
}

int64_t ShardIndexMap::operator()(int64_t local) const {
  if (whole_) return local;
  // Split the flat index into (outer, coordinate along dim, inner).
  const int64_t inner_i = local % inner_;
  const int64_t coord = (local / inner_) % local_dim_;
  const int64_t outer = local / (inner_ * local_dim_);
  const int b = block_of(coord);
  const int64_t g = global_start_[b] + part_offset_[b] + (coord - local_start_[b]);
  return (outer * global_dim_ + g) * inner_ + inner_i;
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
  const int64_t n = p.value.numel();
  // Not value-initialised: the threads below touch (and so place) the pages of their own ranges.
  std::unique_ptr<float[]> host(new float[n]);
  float* out = host.get();
  const ShardIndexMap global_index(p.shard, p.global_shape);
  const uint64_t key = normal_stream_key(seed, hash_name(p.name));
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) out[i] = rule.normal ? rule.std * normal_at(key, global_index(i)) : rule.constant;
  backend.upload(out, p.value);
}

}  // namespace gpt
