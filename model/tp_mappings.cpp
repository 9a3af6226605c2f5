// Tensor-parallel region mappings over the TP communicator.
#include "model/tp_mappings.h"

#include <stdexcept>

namespace gpt {

namespace {
bool sp(const LayerContext& ctx) { return ctx.sequence_parallel && ctx.tp.size() > 1; }

Tensor gather_rows(LayerContext& ctx, const Tensor& shard) {
  Tensor full = ctx.backend.empty({shard.dim(0) * ctx.tp.size(), shard.dim(1)}, shard.dtype());
  ctx.tp.all_gather(shard, full);
  return full;
}
Tensor scatter_rows(LayerContext& ctx, const Tensor& full) {
  if (full.dim(0) % ctx.tp.size() != 0)
    throw std::invalid_argument("sequence parallelism: " + std::to_string(full.dim(0)) +
                                " rows do not split over tensor-parallel size " + std::to_string(ctx.tp.size()));
  Tensor shard = ctx.backend.empty({full.dim(0) / ctx.tp.size(), full.dim(1)}, full.dtype());
  ctx.tp.reduce_scatter(full, shard);
  return shard;
}
}  // namespace

int64_t rows_outside_tp_region(const LayerContext& ctx, int64_t rows_full) {
  return sp(ctx) ? rows_full / ctx.tp.size() : rows_full;
}

Tensor enter_tp_region(LayerContext& ctx, const Tensor& x) { return sp(ctx) ? gather_rows(ctx, x) : x; }

Tensor enter_tp_region_backward(LayerContext& ctx, Tensor& grad_full) {
  if (sp(ctx)) return scatter_rows(ctx, grad_full);
  if (ctx.tp.size() > 1) ctx.tp.all_reduce(grad_full);
  return grad_full;
}

Tensor exit_tp_region(LayerContext& ctx, Tensor& partial) {
  if (sp(ctx)) return scatter_rows(ctx, partial);
  if (ctx.tp.size() > 1) ctx.tp.all_reduce(partial);
  return partial;
}

Tensor exit_tp_region_backward(LayerContext& ctx, const Tensor& grad) { return sp(ctx) ? gather_rows(ctx, grad) : grad; }

}  // namespace gpt
