// Column- and row-parallel linear layers over the backend's linear kernels, or the FP8 ones. Under
// parallel.tp_comm_overlap FP8 layers overlap too: their casts run at the delayed scale, fixed during the
// step, so a row block's cast and product are the whole tensor's rows, and the recorded amax is the
// largest block's.
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
// A row block's input gradient dx = dy . w, in FP8 when the layer is.
void input_gradient_rows(Backend& be, const Fp8LinearScales& fp8, const Tensor& dy, const Tensor& w, Tensor& dx) {
  if (fp8.recipe) fp8_linear_backward_input(be, fp8, dy, w, dx);
  else be.linear_backward_input(dy, w, dx);
}
// pre = x . w^T + b and act = GELU(pre): fused on the backend, or the FP8 product and then GELU.
void forward_gelu_gemm(Backend& be, const Fp8LinearScales& fp8, const Tensor& x, const Tensor& w, const Tensor* b,
                       Tensor& pre, Tensor& act) {
  if (fp8.recipe) {
    fp8_linear_forward(be, fp8, x, w, b, pre);
    be.gelu_forward(pre, act);
  } else {
    be.linear_gelu_forward(x, w, b, pre, act);
  }
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
  forward_gelu_gemm(ctx.backend, fp8_, x, weight_->value, bias_ ? &bias_->value : nullptr, pre, act);
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

void ColumnParallelLinear::forward_with_entry(LayerContext& ctx, const Tensor& x, Tensor& x_full, Tensor& y) const {
  if (!tp_overlap_applies(ctx)) {
    x_full = enter_tp_region(ctx, x);
    forward(ctx, x_full, y);
    return;
  }
  y = ctx.backend.empty({x.dim(0) * ctx.tp.size(), out_local_}, x.dtype());
  const Tensor* b = bias_ ? &bias_->value : nullptr;
  x_full = gather_rows_overlapped(ctx, x, [&](int64_t r0, int64_t r1, const Tensor& x_rows) {
    Tensor y_rows = y.rows(r0, r1);
    forward_gemm(ctx.backend, fp8_, x_rows, weight_->value, b, y_rows);
  });
}

void ColumnParallelLinear::forward_gelu_with_entry(LayerContext& ctx, const Tensor& x, Tensor& x_full, Tensor& pre,
                                                   Tensor& act) const {
  if (!tp_overlap_applies(ctx)) {
    x_full = enter_tp_region(ctx, x);
    forward_gelu(ctx, x_full, pre, act);
    return;
  }
  pre = ctx.backend.empty({x.dim(0) * ctx.tp.size(), out_local_}, x.dtype());
  act = ctx.backend.empty(pre.shape(), x.dtype());
  const Tensor* b = bias_ ? &bias_->value : nullptr;
  x_full = gather_rows_overlapped(ctx, x, [&](int64_t r0, int64_t r1, const Tensor& x_rows) {
    Tensor pre_rows = pre.rows(r0, r1), act_rows = act.rows(r0, r1);
    forward_gelu_gemm(ctx.backend, fp8_, x_rows, weight_->value, b, pre_rows, act_rows);
  });
}

Tensor ColumnParallelLinear::backward_with_entry(LayerContext& ctx, const Tensor& dy, const Tensor& x_full) const {
  if (!tp_overlap_applies(ctx)) {
    Tensor dx_full;
    backward(ctx, dy, x_full, &dx_full);
    return enter_tp_region_backward(ctx, dx_full);
  }
  return reduce_scatter_rows_overlapped(
      ctx, x_full.dim(0), x_full.dim(1), x_full.dtype(),
      [&](int64_t r0, int64_t r1, Tensor& dx_rows) {
        input_gradient_rows(ctx.backend, fp8_, dy.rows(r0, r1), weight_->value, dx_rows);
      },
      [&] {
        backward_gemm(ctx.backend, fp8_, dy, x_full, weight_->value, nullptr, weight_->grad,
                      bias_ ? &bias_->grad : nullptr);
      });
}

Tensor RowParallelLinear::forward_with_exit(LayerContext& ctx, const Tensor& x_local) const {
  if (!tp_overlap_applies(ctx)) {
    Tensor partial;
    forward(ctx, x_local, partial);
    return exit_tp_region(ctx, partial);
  }
  const Tensor* b = adds_bias_ ? &bias_->value : nullptr;
  return reduce_scatter_rows_overlapped(ctx, x_local.dim(0), weight_->value.dim(0), x_local.dtype(),
                                        [&](int64_t r0, int64_t r1, Tensor& y_rows) {
                                          forward_gemm(ctx.backend, fp8_, x_local.rows(r0, r1), weight_->value, b,
                                                       y_rows);
                                        });
}

namespace {
// The row-parallel layer's overlapped backward up to the activation: gathers dy into dy_full while each
// arrived block's input gradient (dx_local's rows) is computed, then the weight and bias gradients.
void row_backward_overlapped(LayerContext& ctx, const Fp8LinearScales& fp8, const Tensor& dy, const Tensor& x_local,
                             Parameter& weight, Parameter* bias, Tensor& dx_local) {
  Backend& be = ctx.backend;
  dx_local = be.empty(x_local.shape(), x_local.dtype());
  Tensor dy_full = gather_rows_overlapped(ctx, dy, [&](int64_t r0, int64_t r1, const Tensor& dy_rows) {
    Tensor dx_rows = dx_local.rows(r0, r1);
    input_gradient_rows(be, fp8, dy_rows, weight.value, dx_rows);
  });
  backward_gemm(be, fp8, dy_full, x_local, weight.value, nullptr, weight.grad, bias ? &bias->grad : nullptr);
}
}  // namespace

void RowParallelLinear::backward_with_exit(LayerContext& ctx, const Tensor& dy, const Tensor& x_local,
                                           Tensor& dx_local) const {
  if (!tp_overlap_applies(ctx)) return backward(ctx, exit_tp_region_backward(ctx, dy), x_local, dx_local);
  row_backward_overlapped(ctx, fp8_, dy, x_local, *weight_, bias_, dx_local);
}

void RowParallelLinear::backward_dgelu_with_exit(LayerContext& ctx, const Tensor& dy, const Tensor& x_local,
                                                 const Tensor& pre, Tensor& dpre) const {
  if (!tp_overlap_applies(ctx)) return backward_dgelu(ctx, exit_tp_region_backward(ctx, dy), x_local, pre, dpre);
  Tensor dact;
  row_backward_overlapped(ctx, fp8_, dy, x_local, *weight_, bias_, dact);
  dpre = ctx.backend.empty(pre.shape(), pre.dtype());
  ctx.backend.gelu_backward(dact, pre, dpre);
}

}  // namespace gpt
