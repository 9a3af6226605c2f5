// Bucket bookkeeping and the non-blocking reductions of the overlapped data-parallel gradient sync.
#include "parallel/data_parallel/grad_buckets.h"

#include <algorithm>
#include <stdexcept>

namespace gpt {

namespace {

// The word embedding (global id 0) and its tied copy are summed over the embedding group after the
// pipeline, so they are never complete during the backward pass.
bool complete_after_pipeline(const Parameter& p) { return p.tied; }

// Buckets [first, last] that the parameter's elements fall in.
std::pair<int64_t, int64_t> buckets_of(ParameterSet& set, const Parameter& p, int64_t bucket_elems) {
  const int64_t off = set.offset_of(p), n = p.grad.numel();
  return {off / bucket_elems, (off + std::max<int64_t>(n, 1) - 1) / bucket_elems};
}

}  // namespace

GradBucketReducer::GradBucketReducer(Communicator& dp, const std::vector<ModelChunk*>& chunks, int64_t bucket_elems,
                                     bool distributed)
    : dp_(dp), bucket_elems_(bucket_elems), distributed_(distributed) {
  if (bucket_elems < 1) throw std::invalid_argument("GradBucketReducer: bucket size must be positive");
  for (ModelChunk* chunk : chunks) {
    ChunkBuckets c;
    c.chunk = chunk;
    const int64_t n = chunk->params().grad_buffer().numel();
    for (int64_t start = 0; start < n; start += bucket_elems)
      c.buckets.push_back({start, std::min(n, start + bucket_elems), 0, 0, false});
    for (auto& p : chunk->params().params()) {
      if (complete_after_pipeline(*p) || p->grad.numel() == 0) continue;
      auto [first, last] = buckets_of(chunk->params(), *p, bucket_elems);
      for (int64_t b = first; b <= last; ++b) c.buckets[b].params++;
    }
    // A bucket that also holds the word embedding must wait for finish(): it never counts down to zero.
    for (auto& p : chunk->params().params())
      if (complete_after_pipeline(*p) && p->grad.numel() > 0) {
        auto [first, last] = buckets_of(chunk->params(), *p, bucket_elems);
        for (int64_t b = first; b <= last; ++b) c.buckets[b].params = -1;
      }
    chunks_.push_back(std::move(c));
  }
  reset();
}

void GradBucketReducer::reset() {
  for (ChunkBuckets& c : chunks_)
    for (Bucket& b : c.buckets) {
      b.waiting_for = b.params;
      b.started = false;
    }
  started_early_ = 0;
}

void GradBucketReducer::start(ChunkBuckets& c, Bucket& b) {
  b.started = true;
  Tensor bucket = c.chunk->params().grad_buffer().slice_elems(b.begin, {b.end - b.begin});
  if (!distributed_) {
    in_flight_.push_back(dp_.all_reduce_async(bucket));
    return;
  }
  // Rank r owns [r * shard, (r + 1) * shard) of the buffer: its block of the bucket is the overlap.
  const int64_t shard = c.chunk->params().grad_buffer().numel() / dp_.size();
  std::vector<int64_t> counts(dp_.size());
  for (int r = 0; r < dp_.size(); ++r)
    counts[r] = std::max<int64_t>(0, std::min(b.end, (r + 1) * shard) - std::max(b.begin, r * shard));
  in_flight_.push_back(dp_.reduce_scatter_blocks_async(bucket, counts));
}

void GradBucketReducer::grads_done(int chunk, const std::vector<Parameter*>& params) {
  ChunkBuckets& c = chunks_.at(chunk);
  for (Parameter* p : params) {
    if (complete_after_pipeline(*p) || p->grad.numel() == 0) continue;
    auto [first, last] = buckets_of(c.chunk->params(), *p, bucket_elems_);
    for (int64_t b = first; b <= last; ++b) c.buckets[b].waiting_for--;
  }
  // Every rank reports the same parameters in the same order, so the buckets start in the same order.
  for (Bucket& b : c.buckets)
    if (!b.started && b.params > 0 && b.waiting_for == 0) {
      start(c, b);
      started_early_++;
    }
  for (auto& pending : in_flight_) pending->progress();
}

void GradBucketReducer::finish() {
  for (ChunkBuckets& c : chunks_)
    for (Bucket& b : c.buckets)
      if (!b.started) start(c, b);
  for (auto& pending : in_flight_) pending->wait();
  in_flight_.clear();
  started_during_backward_ = started_early_;
  reset();
}

}  // namespace gpt
