// Column- and row-parallel linear layers over the backend's linear kernels.
#include "model/parallel_linear.h"

namespace gpt {

ColumnParallelLinear::ColumnParallelLinear(ParameterSet& params, const std::string& prefix, const LinearSpec& s) {
  ShardSpec shard{0, s.blocks, s.tp_size, s.tp_rank, s.block_weights};
  weight_ = &params.add(prefix + ".weight", {s.out, s.in}, shard, true, false);
  weight_->init = {true, s.init_std, 0.f};
  if (s.bias) {
    bias_ = &params.add(prefix + ".bias", {s.out}, shard, false, false);
    bias_->init = {false, 0.f, 0.f};
  }
  out_local_ = s.out / s.tp_size;
}

void ColumnParallelLinear::forward(LayerContext& ctx, const Tensor& x, Tensor& y) const {
  y = ctx.backend.empty({x.dim(0), out_local_}, x.dtype());
  ctx.backend.linear_forward(x, weight_->value, bias_ ? &bias_->value : nullptr, y);
}

void ColumnParallelLinear::forward_gelu(LayerContext& ctx, const Tensor& x, Tensor& pre, Tensor& act) const {
  pre = ctx.backend.empty({x.dim(0), out_local_}, x.dtype());
  act = ctx.backend.empty({x.dim(0), out_local_}, x.dtype());
  ctx.backend.linear_gelu_forward(x, weight_->value, bias_ ? &bias_->value : nullptr, pre, act);
}

void ColumnParallelLinear::backward(LayerContext& ctx, const Tensor& dy, const Tensor& x, Tensor* dx) const {
  if (dx) *dx = ctx.backend.empty(x.shape(), x.dtype());
  ctx.backend.linear_backward(dy, x, weight_->value, dx, weight_->grad, bias_ ? &bias_->grad : nullptr);
}

RowParallelLinear::RowParallelLinear(ParameterSet& params, const std::string& prefix, const LinearSpec& s) {
  weight_ = &params.add(prefix + ".weight", {s.out, s.in}, ShardSpec{1, 1, s.tp_size, s.tp_rank}, true, false);
  weight_->init = {true, s.init_std, 0.f};
  if (s.bias) {
    bias_ = &params.add(prefix + ".bias", {s.out}, {}, false, true);
    bias_->init = {false, 0.f, 0.f};
  }
  adds_bias_ = bias_ && s.tp_rank == 0;
}

void RowParallelLinear::forward(LayerContext& ctx, const Tensor& x_local, Tensor& y_partial) const {
  y_partial = ctx.backend.empty({x_local.dim(0), weight_->value.dim(0)}, x_local.dtype());
  ctx.backend.linear_forward(x_local, weight_->value, adds_bias_ ? &bias_->value : nullptr, y_partial);
}

void RowParallelLinear::backward(LayerContext& ctx, const Tensor& dy, const Tensor& x_local, Tensor& dx_local) const {
  dx_local = ctx.backend.empty(x_local.shape(), x_local.dtype());
  ctx.backend.linear_backward(dy, x_local, weight_->value, &dx_local, weight_->grad, bias_ ? &bias_->grad : nullptr);
}

void RowParallelLinear::backward_dgelu(LayerContext& ctx, const Tensor& dy, const Tensor& x_local, const Tensor& pre,
                                       Tensor& dpre) const {
  dpre = ctx.backend.empty(pre.shape(), pre.dtype());
  ctx.backend.linear_dgelu_backward(dy, x_local, weight_->value, pre, dpre, weight_->grad,
                                    bias_ ? &bias_->grad : nullptr);
}

}  // namespace gpt
