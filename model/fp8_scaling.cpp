// Delayed-scaling state and its update (model/fp8_scaling.h).
#include "model/fp8_scaling.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gpt {

Fp8Recipe parse_fp8_recipe(const std::string& fp8, const std::string& algo, int64_t history_len, int64_t margin) {
  Fp8Recipe r;
  if (fp8 == "off") {
    r.enabled = false;
  } else if (fp8 == "e4m3" || fp8 == "hybrid") {
    r.enabled = true;
    r.hybrid = fp8 == "hybrid";
  } else {
    throw std::invalid_argument("precision.fp8: unknown recipe '" + fp8 + "' (expected off, e4m3 or hybrid)");
  }
  if (algo == "max") {
    r.algo = Fp8AmaxAlgo::Max;
  } else if (algo == "most_recent") {
    r.algo = Fp8AmaxAlgo::MostRecent;
  } else {
    throw std::invalid_argument("precision.fp8_amax_compute_algo: unknown algorithm '" + algo +
                                "' (expected max or most_recent)");
  }
  if (history_len < 1)
    throw std::invalid_argument("precision.fp8_amax_history_len: must be at least 1, got " +
                                std::to_string(history_len));
  if (margin < 0 || margin > 30)
    throw std::invalid_argument("precision.fp8_margin: must be in [0, 30], got " + std::to_string(margin));
  r.history_len = history_len;
  r.margin = margin;
  return r;
}

std::string fp8_recipe_name(const Fp8Recipe& r) { return !r.enabled ? "off" : r.hybrid ? "hybrid" : "e4m3"; }

void Fp8TensorScale::update(const Fp8Recipe& recipe, float reduced) {
  history.insert(history.begin(), reduced);
  if (static_cast<int64_t>(history.size()) > recipe.history_len) history.resize(recipe.history_len);
  pending = 0.f;
  float amax = history.front();
  if (recipe.algo == Fp8AmaxAlgo::Max)
    for (float a : history) amax = std::isnan(a) || std::isnan(amax) ? NAN : std::max(amax, a);
  if (!(amax > 0.f) || !std::isfinite(amax)) return;
  const float s = static_cast<float>(fp8_info(format).max_finite / static_cast<double>(amax) /
                                     std::ldexp(1.0, static_cast<int>(recipe.margin)));
  if (std::isfinite(s) && s > 0.f) scale = s;
}

Fp8TensorScale& Fp8ScaleSet::add(const std::string& name, Fp8Format format) {
  scales_.push_back(std::make_unique<Fp8TensorScale>());
  scales_.back()->name = name;
  scales_.back()->format = format;
  return *scales_.back();
}

std::vector<Fp8TensorScale*> Fp8ScaleSet::all() {
  std::vector<Fp8TensorScale*> out;
  for (auto& s : scales_) out.push_back(s.get());
  return out;
}

std::vector<double> Fp8ScaleSet::pending() const {
  std::vector<double> out;
  for (const auto& s : scales_) out.push_back(s->pending);
  return out;
}

void Fp8ScaleSet::update(const std::vector<double>& reduced) {
  if (reduced.size() != scales_.size())
    throw std::logic_error("Fp8ScaleSet::update: " + std::to_string(reduced.size()) + " amaxes for " +
                           std::to_string(scales_.size()) + " FP8 tensors");
  for (size_t i = 0; i < scales_.size(); ++i) scales_[i]->update(recipe_, static_cast<float>(reduced[i]));
}

}  // namespace gpt
