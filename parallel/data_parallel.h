// Data parallelism and the optimizer step of a replica group.
// Plain: every chunk's flat gradient buffer is summed over the dp group in buckets, front to back (the
// buffer is laid out in reverse layer order, so the first buckets hold the last layers), and every rank
// updates all its parameters.
// Distributed optimizer (ZeRO-1, parallel.distributed_optimizer): the buffers are cut into dp equal
// shards; gradients are reduce-scattered so each rank holds the sum for its shard only, the rank keeps
// fp32 master weights and Adam moments for that shard only, updates it, and the updated values are
// all-gathered back into every rank's value buffer.
// The global gradient norm counts each parameter once (tensor-parallel replicas and the tied copy
// skipped) and sums per-parameter squares in a canonical, layout-independent order, so runs that differ
// only in pipeline layout get bit-identical norms.
#pragma once
#include <memory>
#include <vector>

#include "model/adamw.h"
#include "model/gpt_model.h"
#include "parallel/process_grid.h"

namespace gpt {

class DataParallelOptimizer {
 public:
  // Chunks must have been allocated with pad_multiple = dp size when `distributed` is set.
  DataParallelOptimizer(ParallelState& ps, Backend& backend, std::vector<ModelChunk*> chunks, AdamWConfig cfg,
                        bool distributed, int64_t bucket_bytes);
  // Sums gradients over dp (all of them, or this rank's shard).
  void reduce_gradients();
  // sqrt of the sum of squares of every global gradient element, the same on every rank.
  double grad_norm(int64_t num_global_params);
  // Multiplies every gradient by `unscale` (1 / loss scale) and, when the unscaled norm exceeds `clip`,
  // by clip / (norm + 1e-6) as well (Megatron's rule). `norm` is the unscaled norm.
  void unscale_and_clip(double unscale, double norm, double clip);
  // AdamW step, then (distributed) all-gather of the updated values.
  void step(float lr);
  AdamW& adam() { return adam_; }
  bool distributed() const { return distributed_; }
  // This rank's element range [begin, end) of a chunk's flat buffers (the whole buffer when not distributed).
  std::pair<int64_t, int64_t> shard_range(const ModelChunk& chunk) const;

 private:
  ParallelState& ps_;
  Backend& backend_;
  std::vector<ModelChunk*> chunks_;
  AdamW adam_;
  bool distributed_;
  int64_t bucket_elems_;
};

}  // namespace gpt
