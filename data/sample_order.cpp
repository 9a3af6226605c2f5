// Keyed permutations, split ranges and blending schedules (see sample_order.h). Everything here is a
// pure function of its arguments, which is what makes the data order independent of the parallel layout
// and resumable at any consumed-sample count.
#include "data/sample_order.h"

#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace gpt {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t mix_key(std::initializer_list<uint64_t> words) {
  uint64_t h = 0x6A09E667F3BCC909ull;
  for (uint64_t w : words) h = splitmix64(h ^ splitmix64(w));
  return h;
}

IndexPermutation::IndexPermutation(uint64_t n, uint64_t key) : n_(n) {
  if (n == 0) throw std::invalid_argument("IndexPermutation of an empty range");
  int bits = 1;
  while (bits < 64 && (uint64_t(1) << bits) < n) ++bits;
  half_bits_ = std::max(1, (bits + 1) / 2);
  half_mask_ = half_bits_ >= 64 ? ~uint64_t(0) : (uint64_t(1) << half_bits_) - 1;
  for (size_t r = 0; r < keys_.size(); ++r) keys_[r] = mix_key({key, r});
}

uint64_t IndexPermutation::round(int r, uint64_t half) const { return splitmix64(half ^ keys_[r]) & half_mask_; }

uint64_t IndexPermutation::operator()(uint64_t i) const {
  if (i >= n_) throw std::out_of_range("IndexPermutation: index outside its range");
  if (n_ == 1) return 0;
  uint64_t x = i;
  do {  // cycle-walk: the permutation of the power-of-two domain, applied until the value is in range
    uint64_t left = x >> half_bits_, right = x & half_mask_;
    for (int r = 0; r < int(keys_.size()); ++r) {
      uint64_t next = left ^ round(r, right);
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= n_);
  return x;
}

std::array<double, 3> parse_split(const std::string& split, const std::string& what) {
  std::array<double, 3> w{0, 0, 0};
  size_t part = 0, pos = 0;
  while (true) {
    size_t end = split.find_first_of(",/", pos);
    std::string tok = split.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (part >= 3) throw std::runtime_error(what + " '" + split + "': at most three parts (train,valid,test)");
    char* stop = nullptr;
    double v = std::strtod(tok.c_str(), &stop);
    if (tok.empty() || *stop != '\0' || !std::isfinite(v) || v < 0)
      throw std::runtime_error(what + " '" + split + "': '" + tok + "' is not a non-negative number");
    w[part++] = v;
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  double sum = w[0] + w[1] + w[2];
  if (sum <= 0) throw std::runtime_error(what + " '" + split + "': the parts sum to zero");
  for (double& v : w) v /= sum;
  return w;
}

std::array<int64_t, 4> split_boundaries(const std::array<double, 3>& w, int64_t n) {
  std::array<int64_t, 4> b{0, 0, 0, 0};
  // std::nearbyint rounds half to even, as Python's round() in Megatron does.
  for (int k = 0; k < 3; ++k) b[k + 1] = b[k] + int64_t(std::nearbyint(w[k] * double(n)));
  int64_t diff = b[3] - n;
  for (int k = 1; k < 4; ++k) b[k] -= diff;
  return b;
}

BlendSchedule::BlendSchedule(std::vector<double> weights) : w_(std::move(weights)) {
  if (w_.empty()) throw std::invalid_argument("BlendSchedule without datasets");
  double sum = 0;
  for (double v : w_) {
    if (!(v >= 0) || !std::isfinite(v)) throw std::runtime_error("blend weights must be non-negative numbers");
    sum += v;
  }
  if (sum <= 0) throw std::runtime_error("blend weights sum to zero");
  for (double& v : w_) v /= sum;
  checkpoints_.push_back(std::vector<int64_t>(w_.size(), 0));
}

// weight * at - count, with the product rounded on its own: a fused multiply-add (which an FMA-capable
// -march or a dispatched clone would otherwise allow) changes near-ties, and so the order, from one machine
// to the next.
static double blend_error(double weight, double at, int64_t count) {
  volatile double product = weight * at;
  return product - double(count);
}

size_t BlendSchedule::step(int64_t i, std::vector<int64_t>& counts) const {
  double at = std::max(double(i), 1.0);
  size_t best = 0;
  double best_err = blend_error(w_[0], at, counts[0]);
  for (size_t d = 1; d < w_.size(); ++d) {
    double err = blend_error(w_[d], at, counts[d]);
    if (err > best_err) best_err = err, best = d;
  }
  return best;
}

std::pair<size_t, int64_t> BlendSchedule::locate(int64_t i) const {
  if (i < 0) throw std::out_of_range("negative blended sample index");
  std::vector<int64_t> counts;
  int64_t k = i / kStride;
  {
    std::lock_guard<std::mutex> lock(m_);
    while (int64_t(checkpoints_.size()) <= k) {
      std::vector<int64_t> c = checkpoints_.back();
      int64_t start = int64_t(checkpoints_.size() - 1) * kStride;
      for (int64_t j = start; j < start + kStride; ++j) ++c[step(j, c)];
      checkpoints_.push_back(std::move(c));
    }
    counts = checkpoints_[k];
  }
  for (int64_t j = k * kStride; j < i; ++j) ++counts[step(j, counts)];
  size_t d = step(i, counts);
  return {d, counts[d]};
}

}  // namespace gpt
