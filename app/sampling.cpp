// Greedy, top-k and top-p (nucleus) token choice over a logits row (app/sampling.h).
#include "app/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

void check_sampling_options(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    throw std::invalid_argument("--temperature " + std::to_string(o.temperature) + ": expected a number >= 0 (0 is greedy)");
  if (o.top_k < 0) throw std::invalid_argument("--top-k " + std::to_string(o.top_k) + ": expected >= 0 (0 keeps every token)");
  if (!(o.top_p > 0 && o.top_p <= 1))
    throw std::invalid_argument("--top-p " + std::to_string(o.top_p) + ": expected a probability in (0, 1]");
}

int32_t argmax_token(std::span<const float> logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i]) && (best < 0 || logits[i] > logits[best])) best = static_cast<int32_t>(i);
  if (best < 0) throw std::runtime_error("sampling: every logit is NaN or infinite; the model's weights are broken");
  return best;
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng) {
  check_sampling_options(o);
  if (o.temperature == 0 || o.top_k == 1) return argmax_token(logits);
  // Candidates by decreasing logit (index order on ties, so the choice is reproducible).
  std::vector<int32_t> order;
  order.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i])) order.push_back(static_cast<int32_t>(i));
  if (order.empty()) throw std::runtime_error("sampling: every logit is NaN or infinite; the model's weights are broken");
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < order.size()) order.resize(static_cast<size_t>(o.top_k));
  // Probabilities of the candidates at this temperature, in double.
  std::vector<double> p(order.size());
  const double top = logits[order.front()];
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  // Nucleus: the shortest prefix whose mass reaches top_p (at least one token).
  size_t keep = order.size();
  if (o.top_p < 1) {
    double mass = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      mass += p[i] / sum;
      if (mass >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double kept = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  // One uniform draw in [0, kept): 53 random bits, independent of the standard library's distributions.
  const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0) * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace gpt
