// expect_same_weights(a, b, what): two runs' global parameters (Trainer::gather_global_params) hold the
// same tensors in the same order with the same bits; for the tests whose two paths must agree exactly.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

using GlobalWeights = std::vector<std::pair<std::string, std::vector<float>>>;

inline void expect_same_weights(const GlobalWeights& a, const GlobalWeights& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].first, b[k].first) << what;
    ASSERT_EQ(a[k].second.size(), b[k].second.size()) << what << " " << a[k].first;
    EXPECT_EQ(std::memcmp(a[k].second.data(), b[k].second.data(), a[k].second.size() * sizeof(float)), 0)
        << what << " " << a[k].first;
  }
}

}  // namespace gpt
