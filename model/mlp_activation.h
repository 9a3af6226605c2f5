// The MLP's activation between its two linears, chosen once at construction (model.swiglu): GELU (tanh
// approximation) of fc1's output, or SwiGLU, silu(gate) * up of fc1's output [gate | up] (each rank holds
// its slice of both halves, so the product stays local). The activation is the block's widest tensor;
// selective recomputation drops it and rebuilds it from fc1's output with forward().
#pragma once
#include "model/model_description.h"
#include "model/ops/backend.h"

namespace gpt {

class MlpActivation {
 public:
  explicit MlpActivation(bool swiglu) : swiglu_(swiglu) {}
  // fc1 [rows, fc1_width/tp] -> act [rows, ffn/tp] (allocated here).
  void forward(Backend& be, const Tensor& fc1, Tensor& act) const;
  // dact [rows, ffn/tp] -> dfc1 [rows, fc1_width/tp] (allocated here).
  void backward(Backend& be, const Tensor& dact, const Tensor& fc1, Tensor& dfc1) const;

 private:
  bool swiglu_;
};

}  // namespace gpt
