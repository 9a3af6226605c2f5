// Bucketed data-parallel all-reduce, ZeRO-1 sharding, global norm, clipping and the optimizer step.
#include "parallel/data_parallel.h"

#include <cmath>

namespace gpt {

DataParallelOptimizer::DataParallelOptimizer(ParallelState& ps, Backend& backend, std::vector<ModelChunk*> chunks,
                                             AdamWConfig cfg, bool distributed, int64_t bucket_bytes)
    : ps_(ps), backend_(backend), chunks_(std::move(chunks)), adam_(backend, cfg),
      distributed_(distributed && ps.dp_size() > 1), bucket_elems_(std::max<int64_t>(1, bucket_bytes / 4)) {
  for (ModelChunk* c : chunks_) {
    auto [begin, end] = shard_range(*c);
    ParameterSet& set = c->params();
    for (auto& p : set.params()) {
      int64_t off = set.offset_of(*p), n = p->grad.numel();
      int64_t lo = std::max(off, begin), hi = std::min(off + n, end);
      if (lo >= hi) continue;
      adam_.add_segment(p.get(), set.value_buffer().slice_elems(lo, {hi - lo}),
                        set.grad_buffer().slice_elems(lo, {hi - lo}));
    }
  }
}

std::pair<int64_t, int64_t> DataParallelOptimizer::shard_range(const ModelChunk& chunk) const {
  int64_t n = const_cast<ModelChunk&>(chunk).params().grad_buffer().numel();
  if (!distributed_) return {0, n};
  int64_t shard = n / ps_.dp_size();
  return {ps_.dp_rank() * shard, (ps_.dp_rank() + 1) * shard};
}

void DataParallelOptimizer::reduce_gradients() {
  if (ps_.dp_size() == 1) return;
  for (ModelChunk* c : chunks_) {
    Tensor& buf = c->params().grad_buffer();
    if (distributed_) {
      auto [begin, end] = shard_range(*c);
      Tensor shard = backend_.empty({end - begin});
      ps_.dp->reduce_scatter(buf, shard);
      Tensor mine = buf.slice_elems(begin, {end - begin});
      backend_.copy(shard, mine);
      continue;
    }
    for (int64_t start = 0; start < buf.numel(); start += bucket_elems_) {
      Tensor bucket = buf.slice_elems(start, {std::min(bucket_elems_, buf.numel() - start)});
      ps_.dp->all_reduce(bucket);
    }
  }
}

double DataParallelOptimizer::grad_norm(int64_t num_global_params) {
  std::vector<double> squares(num_global_params, 0.0);
  for (OptimizerSegment& s : adam_.segments()) {
    if (s.param->tied_copy || (s.param->tp_replicated && ps_.tp_rank() != 0)) continue;
    squares.at(s.param->global_id) += backend_.sum_squares(s.grad);
  }
  ps_.model_parallel->all_reduce_host(squares.data(), num_global_params);
  if (distributed_) ps_.dp->all_reduce_host(squares.data(), num_global_params);
  double total = 0;
  for (double v : squares) total += v;
  return std::sqrt(total);
}

void DataParallelOptimizer::unscale_and_clip(double unscale, double norm, double clip) {
  double coeff = unscale;
  if (clip > 0 && clip / (norm + 1e-6) < 1.0) coeff *= clip / (norm + 1e-6);
  if (coeff == 1.0) return;
  for (OptimizerSegment& s : adam_.segments()) backend_.scale(s.grad, static_cast<float>(coeff));
}

void DataParallelOptimizer::step(float lr) {
  adam_.step(lr);
  if (!distributed_) return;
  for (ModelChunk* c : chunks_) {
    auto [begin, end] = shard_range(*c);
    Tensor& values = c->params().value_buffer();
    Tensor shard = backend_.empty({end - begin}, values.dtype());
    backend_.copy(values.slice_elems(begin, {end - begin}), shard);
    ps_.dp->all_gather(shard, values);
  }
}

}  // namespace gpt
