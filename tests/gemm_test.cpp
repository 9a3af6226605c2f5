// The CPU backend's matrix product (cpu_matmul.h, oneDNN) against an fp64 reference of the same inputs:
// bf16 and fp32, every transpose combination, ragged sizes, odd K, leading dimensions wider than the
// matrix, alpha/beta (beta = 0 must overwrite NaN), the bias input and an empty sum, bf16 destinations;
// the primitive cache (no primitive is created after a training step's first); then the bf16 linear
// layer against the fp32 path on the same values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "app/trainer.h"
#include "model/ops/backend.h"
#include "model/ops/cpu/cpu_matmul.h"
#include "model/ops/half.h"
#include "tests/tiny_model_config.h"

namespace gpt {
namespace {

struct Case {
  bool ta, tb;
  int64_t M, N, K;
};

// Max over C of |C - ref| / (|alpha| sum_k |a b| + |beta c0|): the error relative to the sum's magnitude.
float value(uint16_t bits) { return bf16_to_fp32(bits); }
float value(float v) { return v; }
void draw(uint16_t& out, float v) { out = fp32_to_bf16(v); }
void draw(float& out, float v) { out = v; }
cpu::MatType type_of(const uint16_t*) { return cpu::MatType::BF16; }
cpu::MatType type_of(const float*) { return cpu::MatType::F32; }

// C = alpha op(A) op(B) (+ bias) + beta C through cpu::matmul; C has leading dimension ldc.
template <class T>
void run_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
              int64_t ldb, float beta, float* C, int64_t ldc, const float* bias = nullptr) {
  cpu::MatmulShape s;
  s.trans_a = ta, s.trans_b = tb;
  s.M = M, s.N = N, s.K = K;
  s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  s.a = s.b = type_of(A);
  s.alpha = alpha, s.beta = beta, s.bias = bias != nullptr;
  cpu::matmul(s, A, B, C, bias);
}

// Max over C of |C - ref| / (|alpha| sum_k |a b| + |beta c0| + |bias|): the error relative to the sum's
// magnitude. `pad` widens every leading dimension past the matrix; C's padding must stay untouched.
template <class T>
double gemm_error(const Case& c, float alpha, float beta, std::mt19937& rng, int64_t pad = 0, bool with_bias = false) {
  std::normal_distribution<float> dist;
  const int64_t lda = (c.ta ? c.M : c.K) + pad, ldb = (c.tb ? c.K : c.N) + pad, ldc = c.N + pad;
  std::vector<T> A((c.ta ? c.K : c.M) * lda), B((c.tb ? c.N : c.K) * ldb);
  for (auto& v : A) draw(v, dist(rng));
  for (auto& v : B) draw(v, dist(rng));
  std::vector<float> C(c.M * ldc), C0, bias(c.N);
  for (auto& v : C) v = beta == 0.f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
  for (auto& v : bias) v = dist(rng);
  C0 = C;
  run_gemm(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc,
           with_bias ? bias.data() : nullptr);
  double worst = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const double got = C[i * ldc + j];
      if (j >= c.N) {  // padding: never written
        if (!(std::isnan(got) && std::isnan(C0[i * ldc + j])) && got != C0[i * ldc + j])
          return std::numeric_limits<double>::infinity();
        continue;
      }
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = value(c.ta ? A[k * lda + i] : A[i * lda + k]);
        const double b = value(c.tb ? B[j * ldb + k] : B[k * ldb + j]);
        sum += a * b;
        mag += std::fabs(a * b);
      }
      const double c0 = beta == 0.f ? 0.0 : beta * double(C0[i * ldc + j]);
      const double bj = with_bias ? bias[j] : 0.0;
      const double ref = alpha * sum + c0 + bj;
      const double scale = std::fabs(alpha) * mag + std::fabs(c0) + std::fabs(bj) + 1e-30;
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
            const double err = gemm_error<T>(c, 0.75f, beta, rng, (M + K) % 3);
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

TEST(GemmTest, Bf16MatchesFp64ReferenceOnRaggedShapes) { check_ragged_shapes<uint16_t>(7); }

TEST(GemmTest, F32MatchesFp64ReferenceOnRaggedShapes) { check_ragged_shapes<float>(8); }

TEST(GemmTest, BiasEmptySumAndLargeProducts) {
  std::mt19937 rng(11);
  for (int64_t K : {0, 1, 300}) {
    EXPECT_LT(gemm_error<float>({false, true, 37, 45, K}, 1.f, 0.f, rng, 0, true), 2e-6) << "K " << K;
    EXPECT_LT(gemm_error<uint16_t>({false, true, 37, 45, K}, 1.f, 0.f, rng, 3, true), 2e-6) << "K " << K;
  }
  EXPECT_LT(gemm_error<float>({false, false, 1, 1, 0}, 1.f, 0.5f, rng), 2e-6);  // empty sum with beta
  // Shapes past any one cache block, both dtypes, accumulating (beta = 1) as weight gradients do.
  EXPECT_LT(gemm_error<uint16_t>({false, true, 24, 3100, 1100}, 1.f, 1.f, rng), 2e-6);
  EXPECT_LT(gemm_error<uint16_t>({true, false, 300, 40, 600}, 1.f, 0.f, rng), 2e-6);
  EXPECT_LT(gemm_error<float>({false, false, 24, 3100, 600}, 1.f, 1.f, rng), 2e-6);
}

// Primitives are cached by shape: the same shape again, and another shape in between, give the same bits.
TEST(GemmTest, CachedPrimitivesGiveTheSameResult) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  const int64_t M = 150, N = 90, K = 700;
  std::vector<float> A(M * K), B(N * K), first(M * N), again(M * N), other(40 * N);
  for (auto& v : A) v = dist(rng);
  for (auto& v : B) v = dist(rng);
  run_gemm(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, first.data(), N);
  run_gemm(false, true, 40, N, K, 1.f, A.data(), K, B.data(), K, 0.f, other.data(), N);
  run_gemm(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, again.data(), N);
  EXPECT_EQ(first, again);
}

// Primitives are created for the shapes of the first training step and never again: later steps run
// entirely from the cache, in fp32 and in bf16.
TEST(GemmTest, NoPrimitiveIsCreatedAfterTheFirstStep) {
  for (const char* dtype : {"fp32", "bf16"}) {
    Config cfg = tiny_model_config(dtype);
    cfg.training.train_iters = 4;
    auto be = make_backend("cpu");
    ParallelState ps = single_process_state();
    Trainer trainer(cfg, ps, *be);
    trainer.step();
    const int64_t after_first = cpu::matmul_primitives_created();
    for (int i = 0; i < 3; ++i) trainer.step();
    EXPECT_EQ(cpu::matmul_primitives_created(), after_first) << dtype;
    EXPECT_GT(after_first, 0) << dtype;
  }
}

// A bf16 destination holds the fp32 result rounded once (to nearest even), with and without a bias, and
// with every operand type; the K = 0 case writes the bias rounded.
TEST(GemmTest, Bf16DestinationIsTheFp32ResultRoundedOnce) {
  std::mt19937 rng(13);
  std::normal_distribution<float> dist;
  for (int64_t K : {0, 5, 300}) {
    for (bool with_bias : {false, true}) {
      const int64_t M = 33, N = 47;
      std::vector<uint16_t> A(M * std::max<int64_t>(K, 1)), B(N * std::max<int64_t>(K, 1));
      for (auto& v : A) v = fp32_to_bf16(dist(rng));
      for (auto& v : B) v = fp32_to_bf16(dist(rng));
      std::vector<float> bias(N), f32(M * N);
      for (auto& v : bias) v = dist(rng);
      std::vector<uint16_t> b16(M * N, 0x7fc0);  // NaN: every element must be written
      cpu::MatmulShape s;
      s.trans_b = true;
      s.M = M, s.N = N, s.K = K, s.lda = std::max<int64_t>(K, 1), s.ldb = std::max<int64_t>(K, 1), s.ldc = N;
      s.a = s.b = cpu::MatType::BF16;
      s.bias = with_bias;
      cpu::matmul(s, A.data(), B.data(), f32.data(), with_bias ? bias.data() : nullptr);
      s.c = cpu::MatType::BF16;
      cpu::matmul(s, A.data(), B.data(), b16.data(), with_bias ? bias.data() : nullptr);
      for (int64_t i = 0; i < M * N; ++i)
        ASSERT_EQ(b16[i], fp32_to_bf16(f32[i])) << "K " << K << " bias " << with_bias << " element " << i;
    }
  }
}

// The bf16 linear layer (bf16 products) against the same layer computed from fp32 copies of the same bf16
// values (fp32 products): forward output and all three gradients, with an fp32 logit-like dy rounded to bf16.
TEST(GemmTest, Bf16LinearLayerMatchesFp32PathOnBf16Values) {
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

// What the tensor-parallel overlap (model/tp_overlap.h) relies on for its bit-for-bit equality with the
// plain region: a row block of a linear layer's output, or of its input gradient (linear_backward_input),
// computed on its own is the same bits as those rows of the whole product, and linear_backward_input is
// linear_backward's dx; fp32 and bf16, with row blocks as a tp group of 2, 4 and 8 cuts them.
TEST(GemmTest, RowBlocksOfALinearLayerAreTheWholeProductsRows) {
  auto be = make_backend("cpu");
  const int64_t rows = 64, in = 96, out = 80;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  for (DType d : {DType::F32, DType::BF16}) {
    auto make = [&](Shape s) {
      std::vector<float> v(static_cast<size_t>(s[0] * (s.size() > 1 ? s[1] : 1)));
      for (auto& x : v) x = dist(rng);
      Tensor f = be->empty(s), t = be->empty(s, d);
      be->upload(v.data(), f);
      be->copy(f, t);
      return t;
    };
    Tensor x = make({rows, in}), w = make({out, in}), b = make({out}), dy = make({rows, out});
    Tensor y = be->empty({rows, out}, d), dx = be->empty({rows, in}, d), dx_alone = be->empty({rows, in}, d);
    Tensor dw = be->zeros({out, in});
    be->linear_forward(x, w, &b, y);
    be->linear_backward(dy, x, w, &dx, dw, nullptr);
    be->linear_backward_input(dy, w, dx_alone);
    EXPECT_EQ(std::memcmp(dx.raw(), dx_alone.raw(), dx.bytes()), 0) << dtype_name(d);
    for (int64_t blocks : {2, 4, 8}) {
      const int64_t n = rows / blocks;
      for (int64_t k = 0; k < blocks; ++k) {
        Tensor yk = be->empty({n, out}, d), dxk = be->empty({n, in}, d);
        be->linear_forward(x.rows(k * n, (k + 1) * n), w, &b, yk);
        be->linear_backward_input(dy.rows(k * n, (k + 1) * n), w, dxk);
        EXPECT_EQ(std::memcmp(yk.raw(), y.rows(k * n, (k + 1) * n).raw(), yk.bytes()), 0)
            << dtype_name(d) << " y block " << k << " of " << blocks;
        EXPECT_EQ(std::memcmp(dxk.raw(), dx.rows(k * n, (k + 1) * n).raw(), dxk.bytes()), 0)
            << dtype_name(d) << " dx block " << k << " of " << blocks;
      }
    }
  }
}

}  // namespace
}  // namespace gpt
