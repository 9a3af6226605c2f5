// Bucketed data-parallel reduction, ZeRO-1 sharding, global norm, clipping factor and the optimizer step.
#include "parallel/data_parallel/data_parallel.h"

#include <cmath>

namespace gpt {

DataParallelOptimizer::DataParallelOptimizer(ParallelState& ps, Backend& backend, std::vector<ModelChunk*> chunks,
                                             AdamWConfig cfg, bool distributed, int64_t bucket_bytes,
                                             bool overlap_grad_reduce)
    : ps_(ps), backend_(backend), chunks_(std::move(chunks)), adam_(backend, cfg),
      distributed_(distributed && ps.dp_size() > 1), bucket_elems_(std::max<int64_t>(1, bucket_bytes / 4)) {
  for (ModelChunk* c : chunks_) {
    auto [begin, end] = shard_range(*c);
    ParameterSet& set = c->params();
    // The parameters' pieces inside [begin, end), in buffer order (reverse registration order); the range
    // handed to AdamW spans exactly those (no padding).
    std::vector<AdamW::Piece> pieces;
    int64_t lo_all = end, hi_all = begin;
    for (auto it = set.params().rbegin(); it != set.params().rend(); ++it) {
      Parameter& p = **it;
      const int64_t off = set.offset_of(p), n = p.grad.numel();
      const int64_t lo = std::max(off, begin), hi = std::min(off + n, end);
      if (lo >= hi) continue;
      pieces.push_back({&p, hi - lo});
      lo_all = std::min(lo_all, lo);
      hi_all = std::max(hi_all, hi);
    }
    if (pieces.empty()) continue;
    adam_.add_range(set.value_buffer().slice_elems(lo_all, {hi_all - lo_all}),
                    set.grad_buffer().slice_elems(lo_all, {hi_all - lo_all}), pieces);
    // The norm counts each global parameter once: not the tied copy, not tensor-parallel replicas twice.
    const OptimizerRange& r = adam_.ranges().back();
    std::vector<ops::FlatSegment> counted = r.segments;
    for (size_t k = 0; k < counted.size(); ++k) {
      const Parameter& p = *adam_.segments()[r.first_segment + k].param;
      const bool skip = p.tied_copy || (p.tp_replicated && ps_.tp_rank() != 0);
      counted[k].norm_slot = skip ? -1 : static_cast<int32_t>(p.global_id);
    }
    norm_segments_.push_back(std::move(counted));
  }
  if (overlap_grad_reduce && ps_.dp_size() > 1)
    reducer_ = std::make_unique<GradBucketReducer>(*ps_.dp, chunks_, bucket_elems_, distributed_);
}

std::pair<int64_t, int64_t> DataParallelOptimizer::shard_range(const ModelChunk& chunk) const {
  int64_t n = const_cast<ModelChunk&>(chunk).params().grad_buffer().numel();
  if (!distributed_) return {0, n};
  int64_t shard = n / ps_.dp_size();
  return {ps_.dp_rank() * shard, (ps_.dp_rank() + 1) * shard};
}

void DataParallelOptimizer::grads_done(int chunk, const std::vector<Parameter*>& params) {
  if (reducer_) reducer_->grads_done(chunk, params);
}

void DataParallelOptimizer::reduce_gradients() {
  if (ps_.dp_size() == 1) return;
  if (reducer_) {
    reducer_->finish();
    return;
  }
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

void DataParallelOptimizer::add_grad_squares(Tensor& sums) {
  for (size_t k = 0; k < norm_segments_.size(); ++k)
    backend_.sum_squares_segments(adam_.ranges()[k].grad, norm_segments_[k], sums);
}

double DataParallelOptimizer::global_norm(std::vector<double> squares) {
  const int64_t n = static_cast<int64_t>(squares.size());
  ps_.model_parallel->all_reduce_host(squares.data(), n);
  if (distributed_) ps_.dp->all_reduce_host(squares.data(), n);
  double total = 0;
  for (double v : squares) total += v;
  return std::sqrt(total);
}

double DataParallelOptimizer::gradient_factor(double unscale, double norm, double clip) {
  double factor = unscale;
  if (clip > 0 && clip / (norm + 1e-6) < 1.0) factor *= clip / (norm + 1e-6);
  return factor;
}

void DataParallelOptimizer::step(float lr, double grad_factor) {
  adam_.step(lr, static_cast<float>(grad_factor));
  all_gather_values();
}

void DataParallelOptimizer::all_gather_values() {
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
