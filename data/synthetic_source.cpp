// Synthetic samples: uniform random tokens from a counter RNG, or a fixed repeating pattern.
#include <stdexcept>

#include "data/sample_source.h"
#include "model/init.h"

namespace gpt {

namespace {

class RandomSource final : public SampleSource {
 public:
  RandomSource(int64_t seq, int64_t vocab, uint64_t seed) : seq_(seq), vocab_(vocab), seed_(seed) {}
  int64_t size() const override { return int64_t(1) << 40; }
  void sample(int64_t index, int32_t* tokens) const override {
    uint64_t base = splitmix64(seed_ ^ 0x5EEDDA7Aull) + uint64_t(index) * uint64_t(seq_ + 1);
    for (int64_t t = 0; t <= seq_; ++t) tokens[t] = int32_t(splitmix64(base + t) % uint64_t(vocab_));
  }
  std::string describe() const override { return "synthetic random tokens (vocab " + std::to_string(vocab_) + ")"; }

 private:
  int64_t seq_, vocab_;
  uint64_t seed_;
};

// A cycle of `period` distinct tokens; sample i starts at offset i mod period so every sample differs
// but the next token is always determined by the current one.
class PatternSource final : public SampleSource {
 public:
  PatternSource(int64_t seq, int64_t vocab) : seq_(seq), period_(std::min<int64_t>(vocab, 16)) {}
  int64_t size() const override { return period_; }
  void sample(int64_t index, int32_t* tokens) const override {
    for (int64_t t = 0; t <= seq_; ++t) tokens[t] = int32_t((index + t) % period_);
  }
  std::string describe() const override { return "synthetic repeating pattern (period " + std::to_string(period_) + ")"; }

 private:
  int64_t seq_, period_;
};

}  // namespace

std::unique_ptr<SampleSource> make_synthetic_source(const std::string& kind, int64_t seq_length, int64_t vocab_size,
                                                    uint64_t seed) {
  if (kind == "random") return std::make_unique<RandomSource>(seq_length, vocab_size, seed);
  if (kind == "pattern") return std::make_unique<PatternSource>(seq_length, vocab_size);
  throw std::invalid_argument("data.synthetic: unknown kind '" + kind + "' (expected random or pattern)");
}

}  // namespace gpt
