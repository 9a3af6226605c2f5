// Data parallelism and the optimizer step of a replica group.
// Plain: every chunk's flat gradient buffer is summed over the dp group in buckets, front to back (the
// buffer is laid out in reverse layer order, so the first buckets hold the last layers), and every rank
// updates all its parameters.
// Distributed optimizer (ZeRO-1, parallel.distributed_optimizer): the buffers are cut into dp equal
// shards; gradients are reduce-scattered so each rank holds the sum for its shard only, the rank keeps
// fp32 master weights and Adam moments for that shard only, updates it, and the updated values are
// all-gathered back into every rank's value buffer.
// Overlap (parallel.overlap_grad_reduce): the same buckets start their reductions during the backward
// pass, as soon as their gradients are complete (parallel/data_parallel/grad_buckets.h); reduce_gradients() then only
// finishes them.
// The global gradient norm counts each parameter once (tensor-parallel replicas and the tied copy
// skipped) and sums per-parameter squares in a canonical, layout-independent order, so runs that differ
// only in pipeline layout get bit-identical norms. The per-parameter squares are summed on the device
// (one backend call per flat range) into an array the trainer downloads once per step.
#pragma once
#include <memory>
#include <vector>

#include "model/adamw.h"
#include "model/gpt_model.h"
#include "parallel/data_parallel/grad_buckets.h"
#include "parallel/grid/process_grid.h"

namespace gpt {

class DataParallelOptimizer {
 public:
  // Chunks must have been allocated with pad_multiple = dp size when `distributed` is set.
  DataParallelOptimizer(ParallelState& ps, Backend& backend, std::vector<ModelChunk*> chunks, AdamWConfig cfg,
                        bool distributed, int64_t bucket_bytes, bool overlap_grad_reduce = false);
  // Whether gradient buckets are reduced during the backward pass (then the pipeline reports completed
  // gradients to grads_done).
  bool overlaps_grad_reduce() const { return reducer_ != nullptr; }
  // The gradients of `params` of chunk `chunk` are complete (overlap only; see GradBucketReducer).
  void grads_done(int chunk, const std::vector<Parameter*>& params);
  // Sums gradients over dp (all of them, or this rank's shard): the whole reduction, or with overlap the
  // buckets still to start and the wait for all of them.
  void reduce_gradients();
  // Adds the sum of squares of this rank's share of every global parameter's gradient to
  // sums[global id] (F64 [num_global_params], on the device), each parameter counted once.
  void add_grad_squares(Tensor& sums);
  // sqrt of the sum of squares of every global gradient element, the same on every rank, from the
  // per-parameter sums add_grad_squares left (downloaded): summed over the ranks, then in canonical order.
  double global_norm(std::vector<double> squares);
  // The factor the update multiplies every gradient by: `unscale` (1 / loss scale) and, when the unscaled
  // norm exceeds `clip`, clip / (norm + 1e-6) as well (Megatron's rule). `norm` is the unscaled norm.
  static double gradient_factor(double unscale, double norm, double clip);
  // AdamW step with every gradient multiplied by `grad_factor`, then (distributed) all_gather_values().
  void step(float lr, double grad_factor = 1.0);
  // Distributed: every rank's updated shard of the values, gathered into every rank's value buffers.
  void all_gather_values();
  AdamW& adam() { return adam_; }
  bool distributed() const { return distributed_; }
  // This rank's element range [begin, end) of a chunk's flat buffers (the whole buffer when not distributed).
  std::pair<int64_t, int64_t> shard_range(const ModelChunk& chunk) const;
  int64_t bucket_elems() const { return bucket_elems_; }
  // Buckets the last step started during its backward pass (0 without overlap).
  int64_t buckets_started_during_backward() const { return reducer_ ? reducer_->started_during_backward() : 0; }

 private:
  ParallelState& ps_;
  Backend& backend_;
  std::vector<ModelChunk*> chunks_;
  AdamW adam_;
  bool distributed_;
  int64_t bucket_elems_;
  // Per optimizer range: its segments with the norm slot of the parameters this rank counts.
  std::vector<std::vector<ops::FlatSegment>> norm_segments_;
  std::unique_ptr<GradBucketReducer> reducer_;
};

}  // namespace gpt
