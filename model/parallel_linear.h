// Tensor-parallel linear layers (Megatron's ColumnParallelLinear and RowParallelLinear), without the
// communication around them (the caller places enter_tp_region / exit_tp_region, model/tp_mappings.h).
// Column-parallel: the weight [out, in] is split along `out`; each rank computes its slice of the output
// from the full input. Row-parallel: the weight is split along `in`; each rank multiplies its slice of
// the input into a partial output that exit_tp_region sums; the bias is added once, on tp rank 0, before
// the sum. `blocks` > 1 splits a fused weight (q|k|v, or SwiGLU's gate|up) so that each rank gets its piece
// of every block; `block_weights` sizes unequal blocks (grouped-query attention's q|k|v). Without `bias`
// (Megatron's --disable-bias-linear) the layer has no bias parameter. With `fp8` (a set whose recipe is
// on) the layer's GEMMs run in FP8 (model/fp8_linear.h), its three scales registered in that set.
// The *_with_entry / *_with_exit members also place the region's communication, overlapped with the GEMMs
// under parallel.tp_comm_overlap (model/tp_overlap.h), FP8 layers too (a delayed-scaling cast is
// element-wise at a scale fixed before the step, so row blocks cast and multiply as the whole would).
#pragma once
#include <string>
#include <vector>

#include "model/fp8_linear.h"
#include "model/parameter.h"
#include "model/tp_mappings.h"
#include "model/tp_overlap.h"

namespace gpt {

struct LinearSpec {
  int64_t in = 0, out = 0;
  int blocks = 1;
  std::vector<int64_t> block_weights;  // empty: equal blocks
  bool bias = true;
  float init_std = 0.02f;
  int tp_size = 1, tp_rank = 0;
  Fp8ScaleSet* fp8 = nullptr;  // null or a recipe that is off: the compute dtype's GEMMs
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear(ParameterSet& params, const std::string& prefix, const LinearSpec& spec);
  // y [N, out/tp] = x [N, in] . w^T + b
  void forward(LayerContext& ctx, const Tensor& x, Tensor& y) const;
  // Accumulates dw, db; dx (if non-null) receives this rank's part of the gradient wrt the full input.
  void backward(LayerContext& ctx, const Tensor& dy, const Tensor& x, Tensor* dx) const;
  // forward, then GELU: pre [N, out/tp] as forward's y, act = gelu(pre) (Backend::linear_gelu_forward).
  void forward_gelu(LayerContext& ctx, const Tensor& x, Tensor& pre, Tensor& act) const;
  // The region's entry and this layer together: x (this rank's rows outside the tp region) -> x_full
  // (the gathered input, which backward takes) and y (forward_gelu: pre and act). With the overlap
  // (model/tp_overlap.h) each gathered row block's GEMM runs while the next block travels.
  void forward_with_entry(LayerContext& ctx, const Tensor& x, Tensor& x_full, Tensor& y) const;
  void forward_gelu_with_entry(LayerContext& ctx, const Tensor& x, Tensor& x_full, Tensor& pre, Tensor& act) const;
  // backward and the entry's backward: returns the gradient wrt x (rows outside the region). With the
  // overlap each row block of the input gradient goes to its owner as soon as it is computed, and the
  // weight gradient's GEMM runs while the last blocks are in flight.
  Tensor backward_with_entry(LayerContext& ctx, const Tensor& dy, const Tensor& x_full) const;
  int64_t out_local() const { return out_local_; }

 private:
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  int64_t out_local_;
  Fp8LinearScales fp8_;  // recipe null: no FP8
};

class RowParallelLinear {
 public:
  RowParallelLinear(ParameterSet& params, const std::string& prefix, const LinearSpec& spec);
  // y_partial [N, out] = x_local [N, in/tp] . w_local^T (+ b on tp rank 0)
  void forward(LayerContext& ctx, const Tensor& x_local, Tensor& y_partial) const;
  // Accumulates dw, db; dx_local receives the gradient wrt this rank's input slice.
  void backward(LayerContext& ctx, const Tensor& dy, const Tensor& x_local, Tensor& dx_local) const;
  // backward where x_local = gelu(pre): dpre = dx_local * gelu'(pre) instead of dx_local
  // (Backend::linear_dgelu_backward).
  void backward_dgelu(LayerContext& ctx, const Tensor& dy, const Tensor& x_local, const Tensor& pre,
                      Tensor& dpre) const;
  // This layer and the region's exit together: returns the output rows outside the region (summed over
  // the group). With the overlap (model/tp_overlap.h) each row block of the partial sums goes to its
  // owner while the next block's GEMM runs.
  Tensor forward_with_exit(LayerContext& ctx, const Tensor& x_local) const;
  // The exit's backward and backward (backward_dgelu): dy holds the output gradient's rows outside the
  // region. With the overlap each gathered row block's input-gradient GEMM runs while the next travels.
  void backward_with_exit(LayerContext& ctx, const Tensor& dy, const Tensor& x_local, Tensor& dx_local) const;
  void backward_dgelu_with_exit(LayerContext& ctx, const Tensor& dy, const Tensor& x_local, const Tensor& pre,
                                Tensor& dpre) const;

 private:
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  bool adds_bias_;
  Fp8LinearScales fp8_;
};

}  // namespace gpt
