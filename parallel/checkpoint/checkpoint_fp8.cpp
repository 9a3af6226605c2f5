// Packing of the FP8 scaling state into checkpoint tensors (checkpoint_fp8.h).
#include "parallel/checkpoint/checkpoint_fp8.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "parallel/checkpoint/checkpoint_format.h"

namespace gpt {

bool is_fp8_state_name(const std::string& name) { return name.find(".fp8.") != std::string::npos; }

std::vector<float> pack_fp8_scale(const Fp8TensorScale& s, int64_t history_len) {
  std::vector<float> v(static_cast<size_t>(2 + history_len), 0.f);
  const size_t n = std::min(s.history.size(), static_cast<size_t>(history_len));
  v[0] = s.scale;
  v[1] = static_cast<float>(n);
  std::copy(s.history.begin(), s.history.begin() + n, v.begin() + 2);
  return v;
}

void unpack_fp8_scale(const std::vector<float>& stored, const Fp8Recipe& recipe, Fp8TensorScale& s,
                      const std::string& where) {
  const float n = stored.size() >= 2 ? stored[1] : -1.f;
  if (stored.size() < 2 || !(n >= 0) || n != std::floor(n) || n > static_cast<float>(stored.size() - 2) ||
      !(stored[0] > 0) || !std::isfinite(stored[0]))
    throw CheckpointError(fmt::format("checkpoint {}: FP8 state {} is malformed ({} values, scale {}, history {})",
                                      where, s.name, stored.size(), stored.empty() ? 0.f : stored[0], n));
  s.scale = stored[0];
  const size_t keep = std::min(static_cast<size_t>(n), static_cast<size_t>(recipe.history_len));
  s.history.assign(stored.begin() + 2, stored.begin() + 2 + keep);
  s.pending = 0.f;
}

}  // namespace gpt
