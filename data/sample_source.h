// SampleSource: where training and evaluation samples come from. A sample is seq_length + 1 token ids
// (inputs are the first seq_length, targets the last seq_length). Sources are indexed by a global sample
// index so the order depends only on the seed and the data, never on the parallel layout: the batch
// loader asks for exactly the indices this data-parallel rank owns.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace gpt {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Number of distinct samples in one epoch (sources may wrap around past it).
  virtual int64_t size() const = 0;
  // Writes seq_length + 1 token ids of global sample `index` (index may exceed size(): later epochs).
  virtual void sample(int64_t index, int32_t* tokens) const = 0;
  virtual std::string describe() const = 0;
};

// Synthetic data: "random" draws uniform tokens from a counter-based RNG keyed by (seed, index);
// "pattern" repeats a fixed short token cycle (for memorization tests). Both are pure functions of the index.
std::unique_ptr<SampleSource> make_synthetic_source(const std::string& kind, int64_t seq_length, int64_t vocab_size,
                                                    uint64_t seed);

}  // namespace gpt
