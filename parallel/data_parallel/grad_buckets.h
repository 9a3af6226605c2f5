// Data-parallel gradient reduction overlapped with the backward pass (Megatron's --overlap-grad-reduce;
// parallel.overlap_grad_reduce). Each model chunk's flat gradient buffer is cut into buckets of
// `bucket_elems` elements, front to back: the buckets the reduction after the backward pass uses too
// (parallel/data_parallel/data_parallel.h). During a chunk's last backward pass of the step the pipeline executor
// reports parameters as their gradients complete (the last blocks first, which the buffer holds first); a
// bucket whose parameters are all complete starts its reduction on the data-parallel communicator's
// non-blocking path at once: an all-reduce, or with the distributed optimizer a reduce-scatter that leaves
// each rank the sums of its shard's part of the bucket. finish() starts the rest and waits for all before
// the optimizer step. The word embedding and its tied copy get the embedding group's sum after the
// pipeline (parallel/data_parallel/grad_sync.h), so the buckets that hold them start in finish(), after that sum, as
// without overlap.
#pragma once
#include <memory>
#include <vector>

#include "model/communicator.h"
#include "model/gpt_model.h"

namespace gpt {

class GradBucketReducer {
 public:
  // `distributed`: each chunk's buffer is cut into dp.size() equal shards, rank r owning shard r.
  GradBucketReducer(Communicator& dp, const std::vector<ModelChunk*>& chunks, int64_t bucket_elems, bool distributed);
  // The gradients of `params` (of chunks[chunk]) are complete for this step.
  void grads_done(int chunk, const std::vector<Parameter*>& params);
  // Starts every bucket not started yet, in order, waits for all, and gets ready for the next step.
  void finish();
  // How many buckets the last finished step started during its backward pass, before finish().
  int64_t started_during_backward() const { return started_during_backward_; }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // element range of the chunk's gradient buffer
    int waiting_for = 0;         // parameters of the bucket whose gradients are not complete yet
    int params = 0;              // parameters reported through grads_done (the others wait for finish)
    bool started = false;
  };
  struct ChunkBuckets {
    ModelChunk* chunk = nullptr;
    std::vector<Bucket> buckets;
  };
  void start(ChunkBuckets& c, Bucket& b);
  void reset();

  Communicator& dp_;
  int64_t bucket_elems_;
  bool distributed_;
  std::vector<ChunkBuckets> chunks_;
  std::vector<std::unique_ptr<PendingSend>> in_flight_;
  int64_t started_early_ = 0, started_during_backward_ = 0;
};

}  // namespace gpt
