// The CPU backend's own GEMMs (cpu_gemm.h) against an fp64 reference of the same inputs: bf16 and fp32,
// every transpose combination, ragged sizes around the micro-kernel (12 x 32), the K slice and odd K,
// alpha/beta (beta = 0 must overwrite NaN), single-threaded and split over threads; results independent
// of the thread split; then the bf16 linear layer against the fp32 path on the same values. Skips (and
// says so) on CPUs without AVX-512 / AVX512-BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "model/ops/backend.h"
#include "model/ops/cpu/cpu_gemm.h"
#include "model/ops/half.h"

namespace gpt {
namespace {

constexpr const char* kNoBf16 = "this CPU has no AVX512-BF16 (or GPT_CPU_GEMM=openblas)";
constexpr const char* kNoF32 = "this CPU has no AVX-512F (or GPT_CPU_GEMM=openblas)";

struct Case {
  bool ta, tb;
  int64_t M, N, K;
};

// Max over C of |C - ref| / (|alpha| sum_k |a b| + |beta c0|): the error relative to the sum's magnitude.
float value(uint16_t bits) { return bf16_to_fp32(bits); }
float value(float v) { return v; }
void draw(uint16_t& out, float v) { out = fp32_to_bf16(v); }
void draw(float& out, float v) { out = v; }
void run_gemm(bool threaded, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
              int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C) {
  (threaded ? cpu::parallel_gemm_bf16 : cpu::gemm_bf16)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
}
void run_gemm(bool threaded, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C) {
  (threaded ? cpu::parallel_gemm_f32 : cpu::gemm_f32)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
}

template <class T>
double gemm_error(const Case& c, float alpha, float beta, bool threaded, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<T> A(c.M * c.K), B(c.K * c.N);
  for (auto& v : A) draw(v, dist(rng));
  for (auto& v : B) draw(v, dist(rng));
  std::vector<float> C(c.M * c.N), C0;
  for (auto& v : C) v = beta == 0.f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
  C0 = C;
  const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
  run_gemm(threaded, c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, C.data());
  double worst = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = value(c.ta ? A[k * lda + i] : A[i * lda + k]);
        const double b = value(c.tb ? B[j * ldb + k] : B[k * ldb + j]);
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

template <class T>
void check_ragged_shapes(uint32_t seed) {
  std::mt19937 rng(seed);
  int checked = 0;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (int64_t M : {1, 11, 12, 13, 200}) {
        for (int64_t N : {1, 31, 33, 70}) {
          for (int64_t K : {1, 2, 7, 256, 513}) {
            const Case c{ta, tb, M, N, K};
            const float beta = (M + N + K) % 3 == 0 ? 0.f : (K % 2 ? 1.f : -0.5f);
            const double err = gemm_error<T>(c, 0.75f, beta, (M * N) % 2 == 0, rng);
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

TEST(GemmTest, Bf16MatchesFp64ReferenceOnRaggedShapes) {
  if (!cpu::bf16_gemm_available()) GTEST_SKIP() << kNoBf16;
  check_ragged_shapes<uint16_t>(7);
}

TEST(GemmTest, F32MatchesFp64ReferenceOnRaggedShapes) {
  if (!cpu::f32_gemm_available()) GTEST_SKIP() << kNoF32;
  check_ragged_shapes<float>(8);
}

// Each C element is summed in the same order whatever the blocking or thread split: one thread and a
// split over four give bit-identical results (ranks holding different rows must agree).
TEST(GemmTest, ResultDoesNotDependOnTheThreadSplit) {
  if (!cpu::f32_gemm_available()) GTEST_SKIP() << kNoF32;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  const int64_t M = 150, N = 90, K = 700;
  std::vector<float> A(M * K), B(N * K), one(M * N), split(M * N);
  for (auto& v : A) v = dist(rng);
  for (auto& v : B) v = dist(rng);
  cpu::gemm_f32(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, one.data(), N);
  for (int64_t lo : {0, 37, 96}) {  // rows lo.. computed on their own, as a thread or a rank would
    cpu::gemm_f32(false, true, M - lo, N, K, 1.f, A.data() + lo * K, K, B.data(), K, 0.f, split.data() + lo * N, N);
    for (int64_t i = lo * N; i < M * N; ++i) ASSERT_EQ(one[i], split[i]) << "element " << i << " rows from " << lo;
  }
}

TEST(GemmTest, WideProductAcrossColumnBlocksAndThreads) {
  if (!cpu::bf16_gemm_available()) GTEST_SKIP() << kNoBf16;
  std::mt19937 rng(11);
  // N beyond one 1536-column block, K beyond one slice, split over threads along N and M.
  EXPECT_LT(gemm_error<uint16_t>({false, true, 24, 3100, 1100}, 1.f, 1.f, true, rng), 2e-6);
  EXPECT_LT(gemm_error<uint16_t>({true, false, 300, 40, 600}, 1.f, 0.f, true, rng), 2e-6);
  EXPECT_LT(gemm_error<float>({false, false, 24, 3100, 600}, 1.f, 1.f, true, rng), 2e-6);
}

// The bf16 linear layer (bf16 GEMM) against the same layer computed from fp32 copies of the same bf16
// values (sgemm): forward output and all three gradients, with an fp32 logit-like dy rounded to bf16.
TEST(GemmTest, Bf16LinearLayerMatchesFp32PathOnBf16Values) {
  if (!cpu::bf16_gemm_available()) GTEST_SKIP() << kNoBf16;
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
