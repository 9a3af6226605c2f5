// LayerNorm layer over the backend's layernorm kernels.
#include "model/layernorm.h"

namespace gpt {

LayerNorm::LayerNorm(ParameterSet& params, const std::string& prefix, int64_t hidden, float eps) : eps_(eps) {
  weight_ = &params.add(prefix + ".weight", {hidden}, {}, false, true);
  weight_->init = {false, 0.f, 1.f};
  bias_ = &params.add(prefix + ".bias", {hidden}, {}, false, true);
  bias_->init = {false, 0.f, 0.f};
  weight_->sequence_parallel_grad = bias_->sequence_parallel_grad = true;
}

void LayerNorm::forward(LayerContext& ctx, const Tensor& x, Tensor& y, Cache& cache) const {
  int64_t n = x.dim(0);
  cache.mean = ctx.backend.empty({n});
  cache.rstd = ctx.backend.empty({n});
  y = ctx.backend.empty(x.shape(), x.dtype());
  ctx.backend.layernorm_forward(x, weight_->value, bias_->value, y, cache.mean, cache.rstd, eps_);
}

void LayerNorm::backward(LayerContext& ctx, const Tensor& dy, const Tensor& x, const Cache& cache, Tensor& dx) const {
  dx = ctx.backend.empty(x.shape(), x.dtype());
  ctx.backend.layernorm_backward(dy, x, weight_->value, cache.mean, cache.rstd, dx, weight_->grad, bias_->grad);
}

}  // namespace gpt
