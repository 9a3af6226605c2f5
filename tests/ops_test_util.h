// Shared helpers of the CPU op tests (tests/ops_test.cpp, tests/ops_storage_test.cpp): the test fixture
// with a CPU backend, host/tensor conversion, random vectors, central finite differences in double and
// the vector tolerances used throughout.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "model/ops/backend.h"
#include "model/ops/cpu/cpu_math.h"
#include "model/ops/cpu/cpu_tensor_access.h"
#include "model/ops/half.h"

#ifdef __F16C__
#include <immintrin.h>
#endif

namespace gpt {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

// ---------------------------------------------------------------------------------------------------
// Helpers

class OpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_backend("cpu");
  std::mt19937 rng{20240601};

  Vec randn(int64_t n, float stddev = 1.f) {
    std::normal_distribution<float> d(0.f, stddev);
    Vec v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }
  Vec uniform(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    Vec v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }
  Tensor make(const Shape& s, const Vec& v, DType dt = DType::F32) {
    Tensor t = be->empty(s, dt);
    EXPECT_EQ(t.numel(), static_cast<int64_t>(v.size()));
    be->upload(v.data(), t);
    return t;
  }
  Tensor make_ids(const Shape& s, const std::vector<int32_t>& v) {
    Tensor t = be->empty(s, DType::I32);
    be->upload_i32(v.data(), t);
    return t;
  }
  Vec host(const Tensor& t) {
    Vec v(t.numel());
    be->download(t, v.data());
    return v;
  }
};

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Central differences of f with respect to every element of x. f must read x afresh on each call. The
// step actually taken is the difference of the two rounded fp32 inputs, not the nominal h.
inline DVec numeric_grad(Vec& x, const std::function<double()>& f, double h) {
  DVec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    const float xp = static_cast<float>(x0 + h), xm = static_cast<float>(x0 - h);
    x[i] = xp;
    const double fp = f();
    x[i] = xm;
    const double fm = f();
    x[i] = x0;
    g[i] = (fp - fm) / (static_cast<double>(xp) - static_cast<double>(xm));
  }
  return g;
}

// ||a - b|| / ||b|| over the whole vector; also insists the reference gradient is not trivially zero.
inline double rel_err(const Vec& analytic, const DVec& numeric) {
  EXPECT_EQ(analytic.size(), numeric.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    diff += (analytic[i] - numeric[i]) * (analytic[i] - numeric[i]);
    norm += numeric[i] * numeric[i];
  }
  EXPECT_GT(norm, 1e-12) << "reference gradient is zero: the check would prove nothing";
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// Directional derivative of f along a random unit-scale direction u, by central differences.
inline double directional_fd(Vec& x, const Vec& u, const std::function<double()>& f, double h) {
  const Vec x0 = x;
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] + static_cast<float>(h) * u[i];
  const double fp = f();
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] - static_cast<float>(h) * u[i];
  const double fm = f();
  x = x0;
  return (fp - fm) / (2 * h);
}

inline void expect_near_vec(const Vec& got, const DVec& want, double atol, double rtol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " at element " << i;
}

// Relative error of a whole gradient vector against FD of an fp32 forward pass. Observed errors are
// 1e-6..2e-4 (FD rounding and truncation), so this leaves a margin of 10x over the worst case.
constexpr double kGradTol = 2e-3;

}  // namespace
}  // namespace gpt
