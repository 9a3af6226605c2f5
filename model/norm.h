// The normalisation layer of the blocks and the final norm, chosen once at construction
// (model.normalization): LayerNorm, weight (init 1) and bias (init 0), or RMSNorm, weight only. Its
// parameters are replicated on every tensor-parallel rank and excluded from weight decay.
#pragma once
#include <string>

#include "model/model_description.h"
#include "model/parameter.h"
#include "model/tp_mappings.h"

namespace gpt {

// The residual stream between blocks with its last add possibly still pending: the value is base + branch,
// or base alone when branch is undefined. A block hands on its h and its MLP output unsummed, and the next
// norm adds them inside its own kernel (Norm::forward_residual), as llm.c fuses each layer's last residual
// add with the next layer's first norm; materialise() sums them where no norm follows (a pipeline stage's
// output). Passed by value and moved, so the branch is released as soon as it has been added.
struct Residual {
  Tensor base, branch;
  Residual rows(int64_t begin, int64_t end) const;  // a row range of both parts
};
Tensor materialise(Backend& backend, Residual x);

class Norm {
 public:
  // Per-row statistics kept for backward: mean (LayerNorm only) and 1/rms or 1/std, F32 [rows].
  struct Cache {
    Tensor mean, rstd;
  };
  Norm(ParameterSet& params, const std::string& prefix, int64_t hidden, float eps, Normalization kind);
  void forward(LayerContext& ctx, const Tensor& x, Tensor& y, Cache& cache) const;
  void backward(LayerContext& ctx, const Tensor& dy, const Tensor& x, const Cache& cache, Tensor& dx) const;
  // The residual add before the norm: h = a + b (allocated here), then forward(h); and backward with the
  // residual stream's gradient dres added into dx. LayerNorm's are fused where the backend can.
  void forward_add(LayerContext& ctx, const Tensor& a, const Tensor& b, Tensor& h, Tensor& y, Cache& cache) const;
  void backward_add(LayerContext& ctx, const Tensor& dy, const Tensor& x, const Cache& cache, const Tensor& dres,
                    Tensor& dx) const;
  // forward of the residual stream's value, which lands in `sum` (x.base itself when nothing is pending).
  // Its backward is backward or backward_add with x = sum: the pending add's gradient is the identity.
  void forward_residual(LayerContext& ctx, Residual x, Tensor& sum, Tensor& y, Cache& cache) const;

 private:
  // y like x, and the statistics forward keeps (rstd; mean for LayerNorm).
  void allocate(LayerContext& ctx, const Tensor& x, Tensor& y, Cache& cache) const;

  Normalization kind_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  float eps_;
};

}  // namespace gpt
