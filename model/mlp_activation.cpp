// GELU and SwiGLU over the backend's kernels.
#include "model/mlp_activation.h"

namespace gpt {

void MlpActivation::forward(Backend& be, const Tensor& fc1, Tensor& act) const {
  const int64_t width = swiglu_ ? fc1.dim(1) / 2 : fc1.dim(1);
  act = be.empty({fc1.dim(0), width}, fc1.dtype());
  if (swiglu_)
    be.swiglu_forward(fc1, act);
  else
    be.gelu_forward(fc1, act);
}

void MlpActivation::backward(Backend& be, const Tensor& dact, const Tensor& fc1, Tensor& dfc1) const {
  dfc1 = be.empty(fc1.shape(), fc1.dtype());
  if (swiglu_)
    be.swiglu_backward(dact, fc1, dfc1);
  else
    be.gelu_backward(dact, fc1, dfc1);
}

void MlpActivation::forward_through(LayerContext& ctx, const ColumnParallelLinear& fc1_layer, const Tensor& x,
                                    Tensor& x_full, Tensor& fc1, Tensor& act) const {
  if (swiglu_) {
    fc1_layer.forward_with_entry(ctx, x, x_full, fc1);
    forward(ctx.backend, fc1, act);
  } else {
    fc1_layer.forward_gelu_with_entry(ctx, x, x_full, fc1, act);
  }
}

void MlpActivation::backward_through(LayerContext& ctx, const RowParallelLinear& fc2_layer, const Tensor& dy,
                                     const Tensor& act, const Tensor& fc1, Tensor& dfc1) const {
  if (swiglu_) {
    Tensor dact;
    fc2_layer.backward_with_exit(ctx, dy, act, dact);
    backward(ctx.backend, dact, fc1, dfc1);
  } else {
    fc2_layer.backward_dgelu_with_exit(ctx, dy, act, fc1, dfc1);
  }
}

}  // namespace gpt
