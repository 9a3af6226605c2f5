// Column- and row-parallel linear layers over the backend's linear kernels, or the FP8 ones.
#include "model/parallel_linear.h"

namespace gpt {

namespace {
Fp8LinearScales fp8_scales(const LinearSpec& s, const std::string& prefix) {
  return s.fp8 && s.fp8->enabled() ? register_fp8_linear(*s.fp8, prefix) : Fp8LinearScales{};
}
void forward_gemm(Backend& be, const Fp8LinearScales& fp8, const Tensor& x, const Tensor& w, const Tensor* b,
                  Tensor& y) {
  if (fp8.recipe) fp8_linear_forward(be, fp8, x, w, b, y);
  else be.linear_forward(x, w, b, y);
}
void backward_gemm(Backend& be, const Fp8LinearScales& fp8, const Tensor& dy, const Tensor& x, const Tensor& w,
                   Tensor* dx, Tensor& dw, Tensor* db) {
  if (fp8.recipe) fp8_linear_backward(be, fp8, dy, x, w, dx, dw, db);
  else be.linear_backward(dy, x, w, dx, dw, db);
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(ParameterSet& params, const std::string& prefix, const LinearSpec& s) {
  ShardSpec shard{0, s.blocks, s.tp_size, s.tp_rank, s.block_weights};
  weight_ = &params.add(prefix + ".weight", {s.out, s.in}, shard, true, false);
  weight_->init = {true, s.init_std, 0.f};
  if (s.bias) {
    bias_ = &params.add(prefix + ".bias", {s.out}, shard, false, false);
    bias_->init = {false, 0.f, 0.f};
  }
  out_local_ = s.out / s.tp_size;
  fp8_ = fp8_scales(s, prefix);
}

void ColumnParallelLinear::forward(LayerContext& ctx, const Tensor& x, Tensor& y) const {
  y = ctx.backend.empty({x.dim(0), out_local_}, x.dtype());
  forward_gemm(ctx.backend, fp8_, x, weight_->value, bias_ ? &bias_->value : nullptr, y);
}

void ColumnParallelLinear::forward_gelu(LayerContext& ctx, const Tensor& x, Tensor& pre, Tensor& act) const {
  pre = ctx.backend.empty({x.dim(0), out_local_}, x.dtype());
  act = ctx.backend.empty({x.dim(0), out_local_}, x.dtype());
  if (fp8_.recipe) {
    fp8_linear_forward(ctx.backend, fp8_, x, weight_->value, bias_ ? &bias_->value : nullptr, pre);
    ctx.backend.gelu_forward(pre, act);
  } else {
    ctx.backend.linear_gelu_forward(x, weight_->value, bias_ ? &bias_->value : nullptr, pre, act);
  }
}

void ColumnParallelLinear::backward(LayerContext& ctx, const Tensor& dy, const Tensor& x, Tensor* dx) const {
  if (dx) *dx = ctx.backend.empty(x.shape(), x.dtype());
  backward_gemm(ctx.backend, fp8_, dy, x, weight_->value, dx, weight_->grad, bias_ ? &bias_->grad : nullptr);
}

RowParallelLinear::RowParallelLinear(ParameterSet& params, const std::string& prefix, const LinearSpec& s) {
  weight_ = &params.add(prefix + ".weight", {s.out, s.in}, ShardSpec{1, 1, s.tp_size, s.tp_rank}, true, false);
  weight_->init = {true, s.init_std, 0.f};
  if (s.bias) {
    bias_ = &params.add(prefix + ".bias", {s.out}, {}, false, true);
    bias_->init = {false, 0.f, 0.f};
  }
  adds_bias_ = bias_ && s.tp_rank == 0;
  fp8_ = fp8_scales(s, prefix);
}

void RowParallelLinear::forward(LayerContext& ctx, const Tensor& x_local, Tensor& y_partial) const {
  y_partial = ctx.backend.empty({x_local.dim(0), weight_->value.dim(0)}, x_local.dtype());
  forward_gemm(ctx.backend, fp8_, x_local, weight_->value, adds_bias_ ? &bias_->value : nullptr, y_partial);
}

void RowParallelLinear::backward(LayerContext& ctx, const Tensor& dy, const Tensor& x_local, Tensor& dx_local) const {
  dx_local = ctx.backend.empty(x_local.shape(), x_local.dtype());
  backward_gemm(ctx.backend, fp8_, dy, x_local, weight_->value, &dx_local, weight_->grad,
                bias_ ? &bias_->grad : nullptr);
}

void RowParallelLinear::backward_dgelu(LayerContext& ctx, const Tensor& dy, const Tensor& x_local, const Tensor& pre,
                                       Tensor& dpre) const {
  dpre = ctx.backend.empty(pre.shape(), pre.dtype());
  if (fp8_.recipe) {
    Tensor dact = ctx.backend.empty(x_local.shape(), x_local.dtype());
    fp8_linear_backward(ctx.backend, fp8_, dy, x_local, weight_->value, &dact, weight_->grad,
                        bias_ ? &bias_->grad : nullptr);
    ctx.backend.gelu_backward(dact, pre, dpre);
    return;
  }
  ctx.backend.linear_dgelu_backward(dy, x_local, weight_->value, pre, dpre, weight_->grad,
                                    bias_ ? &bias_->grad : nullptr);
}

}  // namespace gpt
