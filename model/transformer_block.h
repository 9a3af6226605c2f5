// One pre-norm GPT transformer block with tensor parallelism:
//   h   = x + proj(attention(rope(qkv(ln1(x)))))  qkv column-parallel (heads and query groups split over tp),
//                                                 proj row-parallel; rope only with rotary positions
//   out = h + fc2(act(fc1(ln2(h))))                fc1 column-parallel, fc2 row-parallel
// Both residual adds run inside the norm that follows them: h's in ln2, and out's in the next block's ln1
// (the block hands on out as a pending Residual, model/norm.h).
// The architecture's choices are components picked once at construction from the ModelDescription: the
// norm (LayerNorm | RMSNorm, model/norm.h), the rotary position encoding (model/rotary.h), the MLP
// activation (GELU | SwiGLU, model/mlp_activation.h), the query groups (the width of qkv) and the biases.
// forward() keeps what backward() needs in a BlockCache owned by the caller (one per microbatch in
// flight, so pipeline schedules can hold several).
#pragma once
#include <string>

#include <optional>

#include "model/mlp_activation.h"
#include "model/model_description.h"
#include "model/norm.h"
#include "model/rotary.h"
#include "model/parallel_linear.h"

namespace gpt {

struct BlockSpec {
  ModelDescription model;
  int tp_size = 1, tp_rank = 0;
  Fp8ScaleSet* fp8 = nullptr;  // the chunk's FP8 scales (the linears' GEMMs in FP8 when its recipe is on)
};

// Tensors marked "full" span all B*T rows; the others hold this rank's rows outside the tp region
// (all rows, or one row block under sequence parallelism).
struct BlockCache {
  Tensor input;               // x (the previous block's pending residual, summed by ln1)
  Tensor ln1_full, ln2_full;  // layernorm outputs as the column-parallel linears saw them
  Tensor ln1, h, ln2;
  Tensor qkv, att, fc1, act;  // inside the tp region: full rows, this rank's heads / ffn slice (qkv after rope)
  Tensor lse;                 // attention's per-row softmax statistics [B, local heads, T] fp32 ([2, B, H, T/2]
                              // under context parallelism: one block per local chunk)
  Norm::Cache ln1_stats, ln2_stats;
};

// Activation recomputation. The attention core never keeps its [B, H, T, T] softmax: its backward always
// recomputes it from qkv and the saved statistics (what Megatron's selective mode did for unfused
// attention). Selective now drops the GELU output, the block's widest activation ([rows, ffn/tp]), and
// recomputes it from fc1's output before the MLP backward (one element-wise pass); Full keeps only the
// block's input and reruns the whole block forward before its backward.
enum class Recompute { None, Selective, Full };
Recompute parse_recompute(const std::string& name);

// One decoding step against a key/value cache (generation, one sequence): `cache` [capacity, 3*H*D]
// holds the packed qkv rows (keys already rotated under rope) of positions 0..past-1 (their q slots
// unused); the step writes its own rows
// at past.. and its queries attend to every position up to their own.
struct KvStep {
  Tensor cache;
  int64_t past = 0;
};

class TransformerBlock {
 public:
  TransformerBlock(ParameterSet& params, const std::string& prefix, const BlockSpec& spec);
  // x [rows, C] -> out [rows, C], both residual streams whose last add may be pending: x's is done by
  // ln1, out's is left to whoever reads out next.
  // With `kv`, B must be 1 and the T rows are positions kv->past.. of a sequence whose earlier positions
  // the cache holds.
  void forward(LayerContext& ctx, Residual x, int64_t B, int64_t T, Residual& out, BlockCache& cache,
               Recompute recompute = Recompute::None, const KvStep* kv = nullptr) const;
  // dout [rows, C] -> dx [rows, C]; accumulates parameter gradients; releases the cache's tensors.
  // Recomputes what `recompute` dropped, first.
  void backward(LayerContext& ctx, const Tensor& dout, int64_t B, int64_t T, BlockCache& cache, Tensor& dx,
                Recompute recompute = Recompute::None) const;

 private:
  BlockSpec spec_;
  int64_t local_heads_, local_groups_, head_dim_;
  std::optional<RotaryEmbedding> rope_;
  MlpActivation activation_;
  // Declared in forward order: parameters register (and lay out their gradients) in this order.
  Norm ln1_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
  Norm ln2_;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
};

}  // namespace gpt
