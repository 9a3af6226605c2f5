// Counter-based RNG (splitmix64 + Box-Muller) used for layout-independent weight initialisation and
// synthetic data.
#include "model/init.h"

#include <cmath>

namespace gpt {

uint64_t hash_name(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double uniform_from_key(uint64_t key) {
  // 53 random bits, shifted off zero so log() below is finite.
  return (static_cast<double>(splitmix64(key) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

uint64_t normal_stream_key(uint64_t seed, uint64_t name_hash) { return splitmix64(seed ^ splitmix64(name_hash)); }

float counter_normal(uint64_t seed, uint64_t name_hash, int64_t index) {
  return normal_at(normal_stream_key(seed, name_hash), index);
}

float normal_at(uint64_t stream_key, int64_t index) {
  const uint64_t base = stream_key + 2 * static_cast<uint64_t>(index);
  double u1 = uniform_from_key(base);
  double u2 = uniform_from_key(base ^ 0xD1B54A32D192ED03ull);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace gpt
