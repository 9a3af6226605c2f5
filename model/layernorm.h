// LayerNorm layer: weight (init 1) and bias (init 0) over the hidden dimension, replicated on every
// tensor-parallel rank and excluded from weight decay.
#pragma once
#include <string>

#include "model/parameter.h"
#include "model/tp_mappings.h"

namespace gpt {

class LayerNorm {
 public:
  struct Cache {
    Tensor mean, rstd;
  };
  LayerNorm(ParameterSet& params, const std::string& prefix, int64_t hidden, float eps);
  void forward(LayerContext& ctx, const Tensor& x, Tensor& y, Cache& cache) const;
  void backward(LayerContext& ctx, const Tensor& dy, const Tensor& x, const Cache& cache, Tensor& dx) const;

 private:
  Parameter* weight_;
  Parameter* bias_;
  float eps_;
};

}  // namespace gpt
