// GEMM efficiency by shape (see gemm_efficiency.h): clamped inverse-distance weighting in log2 space.
#include "parallel/plan/gemm_efficiency.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace gpt {

GemmEfficiencyTable::GemmEfficiencyTable(std::vector<GemmShapeEfficiency> entries) : entries_(std::move(entries)) {
  lo_ = {1e300, 1e300, 1e300};
  hi_ = {-1e300, -1e300, -1e300};
  for (const GemmShapeEfficiency& e : entries_) {
    const std::array<double, 3> p = {std::log2(std::max(1.0, e.m)), std::log2(std::max(1.0, e.n)),
                                     std::log2(std::max(1.0, e.k))};
    log2_shapes_.push_back(p);
    for (int a = 0; a < 3; ++a) lo_[a] = std::min(lo_[a], p[a]), hi_[a] = std::max(hi_[a], p[a]);
  }
}

double GemmEfficiencyTable::at(double m, double n, double k) const {
  if (entries_.empty()) throw std::logic_error("GEMM efficiency table is empty");
  const double raw[3] = {std::log2(std::max(1.0, m)), std::log2(std::max(1.0, n)), std::log2(std::max(1.0, k))};
  double q[3];
  for (int a = 0; a < 3; ++a) q[a] = std::clamp(raw[a], lo_[a], hi_[a]);
  double weights = 0, sum = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const std::array<double, 3>& p = log2_shapes_[i];
    const double d0 = q[0] - p[0], d1 = q[1] - p[1], d2 = q[2] - p[2];
    const double dist2 = d0 * d0 + d1 * d1 + d2 * d2;
    if (dist2 < 1e-18) return entries_[i].efficiency;
    const double w = 1.0 / (dist2 * dist2);
    weights += w;
    sum += w * entries_[i].efficiency;
  }
  return sum / weights;
}

double GemmEfficiencyTable::best() const {
  double best = 0;
  for (const GemmShapeEfficiency& e : entries_) best = std::max(best, e.efficiency);
  return best;
}

void GemmEfficiencyTable::validate() const {
  if (entries_.empty()) throw std::invalid_argument("has no entries (needs at least one [m, n, k, efficiency])");
  for (size_t i = 0; i < entries_.size(); ++i) {
    const GemmShapeEfficiency& e = entries_[i];
    const std::string where = fmt::format("entry {} [{}, {}, {}, {}]", i + 1, e.m, e.n, e.k, e.efficiency);
    if (!(e.m >= 1 && e.n >= 1 && e.k >= 1)) throw std::invalid_argument(where + ": m, n and k must be >= 1");
    if (!(e.efficiency > 0 && e.efficiency <= 1))
      throw std::invalid_argument(where + ": the efficiency must lie in (0, 1]");
    for (size_t j = 0; j < i; ++j)
      if (entries_[j].m == e.m && entries_[j].n == e.n && entries_[j].k == e.k)
        throw std::invalid_argument(where + ": the same shape as entry " + std::to_string(j + 1));
  }
}

}  // namespace gpt
