// Microbatch assembly from global sample indices.
#include "data/batch_loader.h"

#include <stdexcept>

namespace gpt {

BatchLoader::BatchLoader(const SampleSource& source, int64_t seq_length, int64_t micro_batch, int64_t global_batch,
                         int dp_size, int dp_rank, int64_t vocab_size)
    : source_(source), seq_(seq_length), micro_batch_(micro_batch), global_batch_(global_batch), dp_size_(dp_size),
      dp_rank_(dp_rank), vocab_(vocab_size) {
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
  std::vector<int32_t> sample(seq_ + 1), tokens(micro_batch_ * seq_), targets(micro_batch_ * seq_);
  auto idx = sample_indices(consumed, j);
  for (int64_t b = 0; b < micro_batch_; ++b) {
    source_.sample(idx[b], sample.data());
    for (int64_t t = 0; t <= seq_; ++t)
      if (sample[t] < 0 || sample[t] >= vocab_)
        throw std::runtime_error("sample " + std::to_string(idx[b]) + " of " + source_.describe() + ": token id " +
                                 std::to_string(sample[t]) + " is outside the model vocabulary (model.vocab_size = " +
                                 std::to_string(vocab_) + ")");
    std::copy(sample.begin(), sample.begin() + seq_, tokens.begin() + b * seq_);
    std::copy(sample.begin() + 1, sample.end(), targets.begin() + b * seq_);
  }
  Microbatch mb;
  mb.B = micro_batch_;
  mb.T = seq_;
  mb.tokens = backend.empty({micro_batch_ * seq_}, DType::I32);
  mb.targets = backend.empty({micro_batch_ * seq_}, DType::I32);
  backend.upload_i32(tokens.data(), mb.tokens);
  backend.upload_i32(targets.data(), mb.targets);
  return mb;
}

}  // namespace gpt
