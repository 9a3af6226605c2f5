// Per-rank batch loader. The global batch of iteration i is the samples [consumed, consumed + global_batch)
// of the source's fixed global order. It is cut into microbatches of micro_batch_size samples; global
// microbatch g = j * dp + dp_rank is the j-th microbatch of data-parallel rank dp_rank. Every layout thus
// sees the same samples in each step, and a rank only reads its own. Under context parallelism (a group of
// cp_size ranks sharing those samples) a rank takes its two chunks of every sequence, tokens and targets
// alike, chunk-major (model/context_chunks.h): seq_length() is then seq_length / cp_size.
#pragma once
#include <vector>

#include "data/sample_source.h"
#include "model/gpt_model.h"

namespace gpt {

class BatchLoader {
 public:
  // dp_size, dp_rank: the data-parallel coordinate (the groups that read different samples).
  BatchLoader(const SampleSource& source, int64_t seq_length, int64_t micro_batch, int64_t global_batch, int dp_size,
              int dp_rank, int64_t vocab_size, int cp_size = 1, int cp_rank = 0);
  int64_t microbatches_per_rank() const { return global_batch_ / (micro_batch_ * dp_size_); }
  int64_t micro_batch() const { return micro_batch_; }
  int64_t seq_length() const { return seq_ / cp_size_; }  // positions per sequence on this rank
  // Microbatch j of this rank for the step that starts at `consumed` samples, uploaded to `backend`.
  // Throws naming the sample when a token id is outside the vocabulary.
  Microbatch load(Backend& backend, int64_t consumed, int64_t j) const;
  // Global sample indices of that microbatch (for tests).
  std::vector<int64_t> sample_indices(int64_t consumed, int64_t j) const;

 private:
  const SampleSource& source_;
  int64_t seq_, micro_batch_, global_batch_;
  int dp_size_, dp_rank_;
  int64_t vocab_;
  int cp_size_, cp_rank_;
};

}  // namespace gpt
