// Parameters and how a rank's shard relates to the global tensor. Every parameter has a global name and
// global shape (the checkpoint and the initialiser speak only in global terms) and a ShardSpec saying
// which slice this rank holds. Gradients are fp32 views into one flat buffer per model chunk so
// data-parallel sync can reduce large contiguous buckets.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/ops/backend.h"
#include "model/tensor.h"

namespace gpt {

// Which slice of the global tensor a rank holds. dim < 0: the full tensor (replicated).
// Otherwise dimension `dim` is cut into `blocks` equal blocks (e.g. 3 for a fused q|k|v weight) and each
// block into `parts` equal pieces; this rank holds piece `part` of every block, concatenated.
struct ShardSpec {
  int dim = -1;
  int blocks = 1;
  int parts = 1;
  int part = 0;

  Shape local_shape(const Shape& global) const;
  // Flat global index of the local element with flat index `local`.
  int64_t global_index(const Shape& global, int64_t local) const;
};

// How to initialise one parameter: normal(0, std) or a constant.
struct InitRule {
  bool normal = true;
  float std = 0.02f;
  float constant = 0.f;
};

struct Parameter {
  std::string name;  // global name, e.g. "layers.3.attention.qkv.weight"
  Shape global_shape;
  ShardSpec shard;
  Tensor value;  // weights used by compute (compute dtype)
  Tensor grad;   // fp32 gradient, a view into the chunk's flat gradient buffer
  bool weight_decay = true;     // false for biases and layernorm parameters
  bool tp_replicated = false;   // the same values live on every tensor-parallel rank
  // A second copy of a tied tensor (the LM head's word embedding on the last pipeline stage): its
  // gradient is summed with the original's, and it is counted once in norms and checkpoints.
  bool tied_copy = false;
  // Under sequence parallelism each tp rank computes this replicated tensor's gradient from its own rows
  // only (layernorm), so the gradients are summed over tp before use.
  bool sequence_parallel_grad = false;
  InitRule init;
  // Which global parameter this is in canonical (layout-independent) order, for the gradient norm.
  int64_t global_id = -1;
};

// Owns a list of parameters, one flat value buffer and one flat fp32 gradient buffer with the same layout.
// Parameters are registered in forward order; the buffers are laid out in reverse registration order so
// backward fills the gradients front to back (data-parallel buckets can start early), and the
// distributed optimizer can shard both buffers by plain element ranges.
class ParameterSet {
 public:
  Parameter& add(std::string name, Shape global_shape, ShardSpec shard, bool weight_decay, bool tp_replicated);
  // Allocates the value buffer (in `dtype`) and the gradient buffer; call once after all add() calls.
  // The buffers are padded to a multiple of `pad_multiple` elements (the distributed optimizer shards them
  // evenly over data-parallel ranks).
  void allocate(Backend& backend, DType dtype, int64_t pad_multiple = 1);
  // Element offset of p in both flat buffers.
  int64_t offset_of(const Parameter& p) const;
  std::vector<Parameter*> all();
  const std::vector<std::unique_ptr<Parameter>>& params() const { return params_; }
  Tensor& grad_buffer() { return grad_buffer_; }
  Tensor& value_buffer() { return value_buffer_; }
  void zero_grad(Backend& backend);

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
  Tensor grad_buffer_, value_buffer_;
};

// Fills p.value from the counter RNG according to p.init.
void init_parameter(Backend& backend, Parameter& p, uint64_t seed);

}  // namespace gpt
