// Microbatch assembly from global sample indices.
#include "data/batch_loader.h"

#include <array>
#include <stdexcept>

#include "model/context_chunks.h"

namespace gpt {

BatchLoader::BatchLoader(const SampleSource& source, int64_t seq_length, int64_t micro_batch, int64_t global_batch,
                         int dp_size, int dp_rank, int64_t vocab_size, int cp_size, int cp_rank)
    : source_(source), seq_(seq_length), micro_batch_(micro_batch), global_batch_(global_batch), dp_size_(dp_size),
      dp_rank_(dp_rank), vocab_(vocab_size), cp_size_(cp_size), cp_rank_(cp_rank) {
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size || seq_length % (2 * cp_size) != 0)
    throw std::invalid_argument("model.seq_length (" + std::to_string(seq_length) +
                                ") must be divisible by 2 x parallel.context (" + std::to_string(cp_size) + ")");
  if (global_batch % (micro_batch * dp_size) != 0)
    throw std::invalid_argument("training.global_batch_size (" + std::to_string(global_batch) +
                                ") must be divisible by micro_batch_size (" + std::to_string(micro_batch) +
                                ") x data-parallel size (" + std::to_string(dp_size) + ")");
}

std::vector<int64_t> BatchLoader::sample_indices(int64_t consumed, int64_t j) const {
  int64_t g = j * dp_size_ + dp_rank_;
  std::vector<int64_t> idx(micro_batch_);
  for (int64_t b = 0; b < micro_batch_; ++b) idx[b] = consumed + g * micro_batch_ + b;
  return idx;
}

Microbatch BatchLoader::load(Backend& backend, int64_t consumed, int64_t j) const {
  const int64_t local = seq_length(), chunk = local / 2;
  std::vector<int32_t> sample(seq_ + 1), tokens(micro_batch_ * local), targets(micro_batch_ * local);
  // Where sequence b's positions go: whole (no context parallelism), or this rank's two chunks, the
  // first chunk's rows of all B sequences before the second's.
  const std::array<int, 2> chunks = context_chunks(cp_size_, cp_rank_);
  const auto place = [&](int64_t b, const int32_t* from, int32_t* to) {
    if (cp_size_ == 1) return std::copy(from, from + seq_, to + b * seq_), void();
    for (int k = 0; k < 2; ++k)
      std::copy(from + chunks[k] * chunk, from + (chunks[k] + 1) * chunk, to + (k * micro_batch_ + b) * chunk);
  };
  auto idx = sample_indices(consumed, j);
  for (int64_t b = 0; b < micro_batch_; ++b) {
    source_.sample(idx[b], sample.data());
    for (int64_t t = 0; t <= seq_; ++t)
      if (sample[t] < 0 || sample[t] >= vocab_)
        throw std::runtime_error("sample " + std::to_string(idx[b]) + " of " + source_.describe() + ": token id " +
                                 std::to_string(sample[t]) + " is outside the model vocabulary (model.vocab_size = " +
                                 std::to_string(vocab_) + ")");
    place(b, sample.data(), tokens.data());
    place(b, sample.data() + 1, targets.data());
  }
  Microbatch mb;
  mb.B = micro_batch_;
  mb.T = local;
  mb.tokens = backend.empty({micro_batch_ * local}, DType::I32);
  mb.targets = backend.empty({micro_batch_ * local}, DType::I32);
  backend.upload_i32(tokens.data(), mb.tokens);
  backend.upload_i32(targets.data(), mb.targets);
  return mb;
}

}  // namespace gpt
