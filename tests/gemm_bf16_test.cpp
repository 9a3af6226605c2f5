// The CPU backend's bf16 GEMM against an fp64 reference of the same bf16 inputs: every transpose
// combination, ragged sizes around the micro-kernel (12 x 32), the K slice (256) and odd K, alpha/beta
// (beta = 0 must overwrite NaN), single-threaded and split over threads; then the bf16 linear layer against
// the fp32 path on the same values. Skips (and says so) on CPUs without AVX512-BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "model/ops/backend.h"
#include "model/ops/cpu/cpu_gemm_bf16.h"
#include "model/ops/half.h"

namespace gpt {
namespace {

struct Case {
  bool ta, tb;
  int64_t M, N, K;
};

// Max over C of |C - ref| / (|alpha| sum_k |a b| + |beta c0|): the error relative to the sum's magnitude.
double gemm_error(const Case& c, float alpha, float beta, bool threaded, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<uint16_t> A(c.M * c.K), B(c.K * c.N);
  for (auto& v : A) v = fp32_to_bf16(dist(rng));
  for (auto& v : B) v = fp32_to_bf16(dist(rng));
  std::vector<float> C(c.M * c.N), C0;
  for (auto& v : C) v = beta == 0.f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
  C0 = C;
  const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
  if (threaded) {
    cpu::parallel_gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), c.N);
  } else {
    cpu::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), c.N);
  }
  double worst = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = bf16_to_fp32(c.ta ? A[k * lda + i] : A[i * lda + k]);
        const double b = bf16_to_fp32(c.tb ? B[j * ldb + k] : B[k * ldb + j]);
        sum += a * b;
        mag += std::fabs(a * b);
      }
      const double c0 = beta == 0.f ? 0.0 : beta * double(C0[i * c.N + j]);
      const double ref = alpha * sum + c0;
      const double scale = std::fabs(alpha) * mag + std::fabs(c0) + 1e-30;
      const double got = C[i * c.N + j];
      if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
      worst = std::max(worst, std::fabs(got - ref) / scale);
    }
  }
  return worst;
}

TEST(GemmBf16Test, MatchesFp64ReferenceOnRaggedShapes) {
  if (!cpu::bf16_gemm_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16 (or GPT_CPU_BF16_GEMM=0)";
  std::mt19937 rng(7);
  int checked = 0;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (int64_t M : {1, 11, 12, 13, 200}) {
        for (int64_t N : {1, 31, 33, 70}) {
          for (int64_t K : {1, 2, 7, 256, 513}) {
            const Case c{ta, tb, M, N, K};
            const float beta = (M + N + K) % 3 == 0 ? 0.f : (K % 2 ? 1.f : -0.5f);
            const double err = gemm_error(c, 0.75f, beta, (M * N) % 2 == 0, rng);
            EXPECT_LT(err, 2e-6) << "ta " << ta << " tb " << tb << " M " << M << " N " << N << " K " << K
                                 << " beta " << beta;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 400);
}

TEST(GemmBf16Test, WideProductAcrossColumnBlocksAndThreads) {
  if (!cpu::bf16_gemm_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16 (or GPT_CPU_BF16_GEMM=0)";
  std::mt19937 rng(11);
  // N beyond one 3072-column block, K beyond one 256 slice, split over threads along N.
  EXPECT_LT(gemm_error({false, true, 24, 3100, 300}, 1.f, 1.f, true, rng), 2e-6);
  EXPECT_LT(gemm_error({true, false, 300, 40, 600}, 1.f, 0.f, true, rng), 2e-6);
}

// The bf16 linear layer (bf16 GEMM) against the same layer computed from fp32 copies of the same bf16
// values (sgemm): forward output and all three gradients, with an fp32 logit-like dy rounded to bf16.
TEST(GemmBf16Test, LinearLayerMatchesFp32PathOnBf16Values) {
  if (!cpu::bf16_gemm_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16 (or GPT_CPU_BF16_GEMM=0)";
  auto be = make_backend("cpu");
  const int64_t rows = 37, in = 70, out = 45;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  auto rounded = [&](int64_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = bf16_to_fp32(fp32_to_bf16(dist(rng)));
    return v;
  };
  const std::vector<float> xv = rounded(rows * in), wv = rounded(out * in), bv = rounded(out), dyv = rounded(rows * out);
  auto make = [&](const std::vector<float>& v, Shape s, DType d) {
    Tensor t = be->empty(s, d);
    be->upload(v.data(), t);
    return t;
  };
  auto run = [&](DType d, std::vector<float>& y, std::vector<float>& dx, std::vector<float>& dw, std::vector<float>& db) {
    Tensor x = make(xv, {rows, in}, d), w = make(wv, {out, in}, d), b = make(bv, {out}, d);
    Tensor dy = make(dyv, {rows, out}, DType::F32);  // fp32, as the LM head's logit gradient
    Tensor yt = be->empty({rows, out}, DType::F32), dxt = be->empty({rows, in}, DType::F32);
    Tensor dwt = be->zeros({out, in}), dbt = be->zeros({out});
    be->linear_forward(x, w, &b, yt);
    be->linear_backward(dy, x, w, &dxt, dwt, &dbt);
    y.resize(rows * out), dx.resize(rows * in), dw.resize(out * in), db.resize(out);
    be->download(yt, y.data()), be->download(dxt, dx.data()), be->download(dwt, dw.data()), be->download(dbt, db.data());
  };
  std::vector<float> y16, dx16, dw16, db16, y32, dx32, dw32, db32;
  run(DType::BF16, y16, dx16, dw16, db16);
  run(DType::F32, y32, dx32, dw32, db32);
  auto close = [](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    double worst = 0, mag = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i]))), mag = std::max(mag, double(std::fabs(b[i])));
    EXPECT_LT(worst, 1e-5 * mag) << what;
  };
  close(y16, y32, "y");
  close(dx16, dx32, "dx");
  close(dw16, dw32, "dw");
  close(db16, db32, "db");
}

}  // namespace
}  // namespace gpt
