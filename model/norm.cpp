// LayerNorm and RMSNorm layers over the backend's kernels, with the residual add before them.
#include "model/norm.h"

namespace gpt {

Residual Residual::rows(int64_t begin, int64_t end) const {
  return {base.rows(begin, end), branch.defined() ? branch.rows(begin, end) : Tensor()};
}

Tensor materialise(Backend& backend, Residual x) {
  if (!x.branch.defined()) return x.base;
  Tensor sum = backend.empty(x.base.shape(), x.base.dtype());
  backend.add(x.base, x.branch, sum);
  return sum;
}

Norm::Norm(ParameterSet& params, const std::string& prefix, int64_t hidden, float eps, Normalization kind)
    : kind_(kind), eps_(eps) {
  weight_ = &params.add(prefix + ".weight", {hidden}, {}, false, true);
  weight_->init = {false, 0.f, 1.f};
  weight_->sequence_parallel_grad = true;
  if (kind_ == Normalization::LayerNorm) {
    bias_ = &params.add(prefix + ".bias", {hidden}, {}, false, true);
    bias_->init = {false, 0.f, 0.f};
    bias_->sequence_parallel_grad = true;
  }
}

void Norm::allocate(LayerContext& ctx, const Tensor& x, Tensor& y, Cache& cache) const {
  const int64_t n = x.dim(0);
  cache.rstd = ctx.backend.empty({n});
  y = ctx.backend.empty(x.shape(), x.dtype());
  if (kind_ == Normalization::LayerNorm) cache.mean = ctx.backend.empty({n});
}

void Norm::forward(LayerContext& ctx, const Tensor& x, Tensor& y, Cache& cache) const {
  allocate(ctx, x, y, cache);
  if (kind_ == Normalization::RMSNorm)
    ctx.backend.rmsnorm_forward(x, weight_->value, y, cache.rstd, eps_);
  else
    ctx.backend.layernorm_forward(x, weight_->value, bias_->value, y, cache.mean, cache.rstd, eps_);
}

void Norm::backward(LayerContext& ctx, const Tensor& dy, const Tensor& x, const Cache& cache, Tensor& dx) const {
  dx = ctx.backend.empty(x.shape(), x.dtype());
  if (kind_ == Normalization::RMSNorm)
    ctx.backend.rmsnorm_backward(dy, x, weight_->value, cache.rstd, dx, weight_->grad);
  else
    ctx.backend.layernorm_backward(dy, x, weight_->value, cache.mean, cache.rstd, dx, weight_->grad, bias_->grad);
}

void Norm::forward_add(LayerContext& ctx, const Tensor& a, const Tensor& b, Tensor& h, Tensor& y, Cache& cache) const {
  h = ctx.backend.empty(a.shape(), a.dtype());
  if (kind_ == Normalization::RMSNorm) {
    ctx.backend.add(a, b, h);
    forward(ctx, h, y, cache);
    return;
  }
  allocate(ctx, a, y, cache);
  ctx.backend.add_layernorm_forward(a, b, weight_->value, bias_->value, h, y, cache.mean, cache.rstd, eps_);
}

void Norm::forward_residual(LayerContext& ctx, Residual x, Tensor& sum, Tensor& y, Cache& cache) const {
  if (!x.branch.defined()) {
    sum = x.base;
    forward(ctx, sum, y, cache);
    return;
  }
  forward_add(ctx, x.base, x.branch, sum, y, cache);
}

void Norm::backward_add(LayerContext& ctx, const Tensor& dy, const Tensor& x, const Cache& cache, const Tensor& dres,
                        Tensor& dx) const {
  if (kind_ == Normalization::RMSNorm) {
    backward(ctx, dy, x, cache, dx);
    ctx.backend.accumulate(dres, dx);
    return;
  }
  dx = ctx.backend.empty(x.shape(), x.dtype());
  ctx.backend.layernorm_backward_add(dy, x, weight_->value, cache.mean, cache.rstd, dres, dx, weight_->grad,
                                     bias_->grad);
}

}  // namespace gpt
