// Parameters and how a rank's shard relates to the global tensor. Every parameter has a global name and
// global shape (the checkpoint and the initialiser speak only in global terms) and a ShardSpec saying
// which slice this rank holds. Gradients are fp32 views into one flat buffer per model chunk so
// data-parallel sync can reduce large contiguous buckets.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/ops/backend.h"
#include "model/tensor.h"

namespace gpt {

// Which slice of the global tensor a rank holds. dim < 0: the full tensor (replicated).
// Otherwise dimension `dim` is cut into `blocks` blocks (e.g. 3 for a fused q|k|v weight) and each block
// into `parts` equal pieces; this rank holds piece `part` of every block, concatenated. The blocks are
// equal, or with `block_weights` (one per block) sized in those proportions: grouped-query attention's
// q|k|v is heads : groups : groups.
struct ShardSpec {
  ShardSpec() = default;
  ShardSpec(int dim, int blocks, int parts, int part, std::vector<int64_t> block_weights = {})
      : dim(dim), blocks(blocks), parts(parts), part(part), block_weights(std::move(block_weights)) {}
  int dim = -1;
  int blocks = 1;
  int parts = 1;
  int part = 0;
  std::vector<int64_t> block_weights;  // empty: equal blocks

  int64_t weight_sum() const;
  int64_t block_weight(int b) const { return block_weights.empty() ? 1 : block_weights[b]; }
  // [dim, blocks, parts, part] followed by the block weights when they are not equal: the form stored in
  // checkpoints. from_ints() reads it back; it throws std::invalid_argument when the list is malformed.
  std::vector<int64_t> to_ints() const;
  static ShardSpec from_ints(const std::vector<int64_t>& v);
  Shape local_shape(const Shape& global) const;
  // Flat global index of the local element with flat index `local`.
  int64_t global_index(const Shape& global, int64_t local) const;
};

// ShardSpec::global_index with the shape arithmetic done once, for loops over every local element.
class ShardIndexMap {
 public:
  ShardIndexMap(const ShardSpec& shard, const Shape& global);
  int64_t operator()(int64_t local) const;
  // The local coordinate along the sharded dimension where the block holding `coord` ends.
  int64_t block_end(int64_t coord) const;
  int64_t inner() const { return inner_; }
  int64_t local_dim() const { return local_dim_; }

 private:
  int block_of(int64_t coord) const;
  bool whole_ = true;
  int64_t inner_ = 1, local_dim_ = 1, global_dim_ = 1;
  // Per block: first local and global coordinate along `dim`, and this rank's offset inside the block.
  std::vector<int64_t> local_start_, global_start_, part_offset_;
  int64_t equal_block_local_ = 0;  // > 0: equal blocks of this local size
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
  // The word embedding or its tied copy, when the LM head is tied to it: their gradients are summed (over
  // the embedding group across pipeline stages) before use. False for an untied model's embedding.
  bool tied = false;
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

// Fills p.value from the counter RNG according to p.init. The elements are generated by all OpenMP
// threads; each is a pure function of (seed, name, global index), so the values do not depend on the
// thread count.
void init_parameter(Backend& backend, Parameter& p, uint64_t seed);

}  // namespace gpt
