// The normalisation layer of the blocks and the final norm, chosen once at construction
// (model.normalization): LayerNorm, weight (init 1) and bias (init 0), or RMSNorm, weight only. Its
// parameters are replicated on every tensor-parallel rank and excluded from weight decay.
#pragma once
#include <string>

#include "model/model_description.h"
#include "model/parameter.h"
#include "model/tp_mappings.h"

namespace gpt {

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

 private:
  // y like x, and the statistics forward keeps (rstd; mean for LayerNorm).
  void allocate(LayerContext& ctx, const Tensor& x, Tensor& y, Cache& cache) const;

  Normalization kind_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  float eps_;
};

}  // namespace gpt
