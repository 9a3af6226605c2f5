// The CUDA backend's tests against the CPU backend: the shared fixture. CudaVsCpu holds both backends (the
// CUDA one created once per process, cuda_test_backend.cpp) and makes the same random inputs on each;
// expect_close compares a result as max |gpu - cpu| / (|cpu| + rms(cpu)) and prints that error on an
// "[error]" line, which scripts/gpu-check.sh collects. Tests skip (GTEST_SKIP) without a device.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/communicator.h"
#include "model/gpt_model.h"
#include "model/ops/backend.h"
#include "model/ops/half.h"
#include "tests/llama_variants.h"

#ifdef GPT_HAVE_CUDA
#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_half.cuh"
#endif

namespace gpt {

using Vec = std::vector<float>;

// The CUDA backend, created once per process; null (with the reason) where it cannot be.
Backend* cuda_backend(std::string* why);


class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    gpu = cuda_backend(&why);
    if (!gpu) GTEST_SKIP() << "no CUDA backend: " << why;
  }

  struct Pair {
    Tensor c, g;  // the same values on the CPU and the GPU
  };

  Vec randn(int64_t n, float stddev = 1.f) {
    std::normal_distribution<float> d(0.f, stddev);
    Vec v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }
  Pair make(const Shape& s, const Vec& v, DType dt = DType::F32) {
    Pair p{cpu->empty(s, dt), gpu->empty(s, dt)};
    cpu->upload(v.data(), p.c);
    gpu->upload(v.data(), p.g);
    return p;
  }
  Pair randn_pair(const Shape& s, DType dt = DType::F32, float stddev = 1.f) { return make(s, randn(shape_numel(s), stddev), dt); }
  Pair ints(const Shape& s, const std::vector<int32_t>& v) {
    Pair p{cpu->empty(s, DType::I32), gpu->empty(s, DType::I32)};
    cpu->upload_i32(v.data(), p.c);
    gpu->upload_i32(v.data(), p.g);
    return p;
  }
  Pair empty(const Shape& s, DType dt = DType::F32) { return {cpu->empty(s, dt), gpu->empty(s, dt)}; }
  Vec host(Backend& be, const Tensor& t) {
    Vec v(t.numel());
    be.download(t, v.data());
    return v;
  }
  // max_i |g - c| / (|c| + rms(c)) <= rtol.
  void expect_close(const Pair& p, double rtol, const std::string& what) {
    expect_close(host(*cpu, p.c), host(*gpu, p.g), rtol, what);
  }
  void expect_close(const Vec& c, const Vec& g, double rtol, const std::string& what) {
    ASSERT_EQ(c.size(), g.size()) << what;
    double ss = 0;
    for (float x : c) ss += double(x) * x;
    const double rms = c.empty() ? 0.0 : std::sqrt(ss / c.size());
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      ASSERT_TRUE(std::isfinite(g[i])) << what << ": GPU value " << g[i] << " at " << i;
      const double err = std::fabs(double(g[i]) - c[i]) / (std::fabs(c[i]) + rms + 1e-30);
      if (err > worst) worst = err, at = i;
    }
    std::printf("[error] %-60s %.3g (tolerance %.3g)\n", what.c_str(), worst, rtol);  // read by gpu-check.sh
    EXPECT_LE(worst, rtol) << what << ": worst at element " << at << " of " << c.size() << ": GPU " << g[at]
                           << " CPU " << c[at] << " (rms " << rms << ")";
  }
  static double tol(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }
  size_t fused_products() const {
#ifdef GPT_HAVE_CUDA
    if (auto* cb = dynamic_cast<CudaBackend*>(gpu)) return cb->gelu_epilogue_products();
#endif
    return 0;
  }
  void attention_paths(DType dt);
  void block_attention(DType dt);
  void llama_ops(DType dt);
  void linear_at_scale(DType dt, int64_t N, int64_t in, int64_t out, bool bias);

  std::unique_ptr<Backend> cpu = make_backend("cpu");
  Backend* gpu = nullptr;
  std::mt19937 rng{20240607};
};

class CudaVsCpuDtype : public CudaVsCpu, public ::testing::WithParamInterface<DType> {};

inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) { return dtype_name(info.param); }

}  // namespace gpt
