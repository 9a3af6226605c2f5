// The pure functions behind the global sample order: a keyed pseudo-random permutation of [0, n) that
// needs no storage (so shuffling a billion samples costs nothing), Megatron's split of documents by a
// "969,30,1" string, and Megatron's deterministic interleaving of blended datasets by weight.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

// A bijection of [0, n) chosen by `key`: a balanced Feistel network on the next even power of two,
// cycle-walked back into range. Same (n, key) -> same permutation, on every machine.
class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t round(int r, uint64_t half) const;
  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  std::array<uint64_t, 6> keys_;
};

// A well-mixed 64-bit key from several words (splitmix64 chaining).
uint64_t mix_key(std::initializer_list<uint64_t> words);

// "969,30,1" (or "0.9/0.05/0.05", fewer than three parts pad with 0) -> weights normalised to sum 1.
// Throws std::runtime_error naming `what` when malformed, negative, or all zero.
std::array<double, 3> parse_split(const std::string& split, const std::string& what = "data.split");

// Megatron's document ranges for train / valid / test: round(weight * n) each, the rounding error taken
// off the later boundaries so the last one ends at n. Returns the four boundaries.
std::array<int64_t, 4> split_boundaries(const std::array<double, 3>& weights, int64_t n);

// Megatron's blending: sample i goes to the dataset whose weight * max(i, 1) is furthest ahead of the
// samples it has already received (ties to the lower index); its index inside that dataset is that count.
// Answers any i without storing the whole sequence: the counts are kept every kStride samples.
class BlendSchedule {
 public:
  explicit BlendSchedule(std::vector<double> weights);  // normalised here
  std::pair<size_t, int64_t> locate(int64_t i) const;   // (dataset, sample within it)
  const std::vector<double>& weights() const { return w_; }

 private:
  static constexpr int64_t kStride = 4096;
  size_t step(int64_t i, std::vector<int64_t>& counts) const;
  std::vector<double> w_;
  mutable std::mutex m_;
  mutable std::vector<std::vector<int64_t>> checkpoints_;  // counts before sample k * kStride
};

}  // namespace gpt
