// The MLP's activation between its two linears, chosen once at construction (model.swiglu): GELU (tanh
// approximation) of fc1's output, or SwiGLU, silu(gate) * up of fc1's output [gate | up] (each rank holds
// its slice of both halves, so the product stays local). The activation is the block's widest tensor;
// selective recomputation drops it and rebuilds it from fc1's output with forward(). With GELU the
// activation runs inside the linears' products where the backend fuses them (forward_through,
// backward_through: Backend::linear_gelu_forward and linear_dgelu_backward); SwiGLU runs between them.
#pragma once
#include "model/model_description.h"
#include "model/ops/backend.h"
#include "model/parallel_linear.h"

namespace gpt {

class MlpActivation {
 public:
  explicit MlpActivation(bool swiglu) : swiglu_(swiglu) {}
  // fc1 [rows, fc1_width/tp] -> act [rows, ffn/tp] (allocated here).
  void forward(Backend& be, const Tensor& fc1, Tensor& act) const;
  // dact [rows, ffn/tp] -> dfc1 [rows, fc1_width/tp] (allocated here).
  void backward(Backend& be, const Tensor& dact, const Tensor& fc1, Tensor& dfc1) const;
  // The region's entry, fc1 and the activation: x [rows outside the tp region, in] -> x_full (fc1's
  // gathered input), fc1 (its output, kept for backward) and act.
  void forward_through(LayerContext& ctx, const ColumnParallelLinear& fc1_layer, const Tensor& x, Tensor& x_full,
                       Tensor& fc1, Tensor& act) const;
  // The region exit's backward, fc2's and the activation's: dy (fc2's output gradient, rows outside the
  // region) -> dfc1, accumulating fc2's dw, db.
  void backward_through(LayerContext& ctx, const RowParallelLinear& fc2_layer, const Tensor& dy, const Tensor& act,
                        const Tensor& fc1, Tensor& dfc1) const;

 private:
  bool swiglu_;
};

}  // namespace gpt
