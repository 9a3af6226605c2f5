// GEMM efficiency by shape: the fraction of a device's dense peak that one matrix product
// C[m, n] = A[m, k] . B[k, n] achieves, read from a small table of measured shapes. Small or thin
// products fill fewer of the device's cores and reuse each loaded element less, so they run further
// below peak than the large square products a single efficiency constant describes.
//
// Lookup: each of log2 m, log2 n, log2 k is clamped to the range the table covers, and the efficiency is
// the entries' efficiencies weighted by 1 / d^4, d the Euclidean distance in (log2 m, log2 n, log2 k);
// a query on an entry returns that entry. The fourth power keeps the weight on the nearest entries (on a
// grid of powers of two, an entry one step away outweighs one two steps away 16 to 1), so a scattered set
// of published measurements works as well as a full grid. Memory-bound products are the time model's
// roofline term, not this table's (parallel/plan/time_model.cpp).
#pragma once
#include <array>
#include <vector>

namespace gpt {

struct GemmShapeEfficiency {
  double m = 0, n = 0, k = 0;  // rows of C, columns of C, the contracted dimension
  double efficiency = 0;       // achieved FLOP/s over the dtype's dense peak, in (0, 1]
};

class GemmEfficiencyTable {
 public:
  GemmEfficiencyTable() = default;
  explicit GemmEfficiencyTable(std::vector<GemmShapeEfficiency> entries);
  // Efficiency of a product of this shape (dimensions >= 1).
  double at(double m, double n, double k) const;
  // The best entry: the efficiency of the largest, most regular products.
  double best() const;
  const std::vector<GemmShapeEfficiency>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  // Throws std::invalid_argument naming the entry and what is wrong (empty table, a dimension < 1, an
  // efficiency outside (0, 1], the same shape twice).
  void validate() const;

 private:
  std::vector<GemmShapeEfficiency> entries_;
  std::vector<std::array<double, 3>> log2_shapes_;  // (log2 m, log2 n, log2 k) of each entry
  std::array<double, 3> lo_{}, hi_{};                // the range each axis covers
};

}  // namespace gpt
