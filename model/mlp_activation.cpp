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

}  // namespace gpt
