// Tests of the CPU backend's Llama-style kernels (model/ops/backend.h): RMSNorm, SwiGLU and the rotary
// embedding against double references and finite differences, in fp32, bf16 and fp16, and their errors
// for bad arguments.
#include "tests/error_of.h"
#include "tests/ops_test_util.h"

namespace gpt {
namespace {

// A suite of its own: OpsTest (ops_test_util.h) is file-local, one class per file.
class OpsLlamaTest : public OpsTest {};

// ---------------------------------------------------------------------------------------------------
// Llama-style ops: RMSNorm, SwiGLU, rotary embedding

// A vector rounded to `dt` and back (the values a 16-bit tensor holds exactly).
Vec rounded(Vec v, DType dt) {
  for (auto& x : v) x = dt == DType::BF16 ? bf16_to_fp32(fp32_to_bf16(x)) : dt == DType::F16 ? fp16_to_fp32(fp32_to_fp16(x)) : x;
  return v;
}

// Tolerance of an op's output in `dt` against a double reference on the same (exactly representable)
// inputs: fp32 math, one final rounding to the dtype.
double out_tol(DType dt) { return dt == DType::BF16 ? 8e-3 : dt == DType::F16 ? 1e-3 : 1e-5; }

TEST_F(OpsLlamaTest, RmsNormForwardMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (auto [N, C] : {std::pair<int64_t, int64_t>{9, 33}, {1, 1}, {300, 257}}) {  // the last one threaded
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " C=" + std::to_string(C));
      const float eps = 1e-5f;
      const Vec x = rounded(randn(N * C, 2.f), dt), g = rounded(randn(C), dt);
      Tensor tx = make({N, C}, x, dt), tg = make({C}, g, dt), y = be->empty({N, C}, dt), rstd = be->empty({N});
      be->rmsnorm_forward(tx, tg, y, rstd, eps);
      DVec y_ref(N * C), r_ref(N);
      for (int64_t n = 0; n < N; ++n) {
        double sq = 0;
        for (int64_t c = 0; c < C; ++c) sq += double(x[n * C + c]) * x[n * C + c];
        r_ref[n] = 1.0 / std::sqrt(sq / C + eps);
        for (int64_t c = 0; c < C; ++c) y_ref[n * C + c] = x[n * C + c] * r_ref[n] * g[c];
      }
      expect_near_vec(host(y), y_ref, out_tol(dt), out_tol(dt), "y");
      expect_near_vec(host(rstd), r_ref, 1e-6, 1e-5, "rstd");
    }
  }
  // fp32 gamma with 16-bit activations (master-precision norm weights) is accepted.
  Tensor x = make({2, 8}, randn(16), DType::BF16), g = make({8}, randn(8)), y = be->empty({2, 8}, DType::BF16);
  Tensor rstd = be->empty({2});
  EXPECT_NO_THROW(be->rmsnorm_forward(x, g, y, rstd, 1e-5f));
}

// Against finite differences of sum(y * R): every element at a small shape, directional derivatives at a
// large, multi-threaded one (per-thread gamma partial sums). dgamma starts non-zero: it must accumulate.
TEST_F(OpsLlamaTest, RmsNormBackwardMatchesFiniteDifferences) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{4, 7}, {96, 384}}) {
    const float eps = 1e-5f;
    Vec x = randn(N * C), g = randn(C), R = randn(N * C);
    Tensor rstd = be->empty({N});
    auto f = [&] {
      Tensor tx = make({N, C}, x), tg = make({C}, g), y = be->empty({N, C});
      be->rmsnorm_forward(tx, tg, y, rstd, eps);
      return dot(host(y), R);
    };
    f();  // rstd of the unperturbed inputs
    const Vec g0 = randn(C);
    Tensor tx = make({N, C}, x), tg = make({C}, g), dy = make({N, C}, R), dx = make({N, C}, Vec(N * C, 9.f));
    Tensor dg = make({C}, g0);
    be->rmsnorm_backward(dy, tx, tg, rstd, dx, dg);
    Vec dgv = host(dg);
    for (int64_t c = 0; c < C; ++c) dgv[c] -= g0[c];
    if (N * C < 100) {
      EXPECT_LT(rel_err(host(dx), numeric_grad(x, f, 3e-3)), kGradTol) << "dx";
      EXPECT_LT(rel_err(dgv, numeric_grad(g, f, 3e-3)), kGradTol) << "dgamma";
    } else {
      const Vec ux = randn(N * C), ug = randn(C);
      const double dx_fd = directional_fd(x, ux, f, 1e-3);
      EXPECT_NEAR(dot(host(dx), ux), dx_fd, 1e-3 * std::fabs(dx_fd) + 2e-2);
      const double dg_fd = directional_fd(g, ug, f, 1e-3);
      EXPECT_NEAR(dot(dgv, ug), dg_fd, 1e-3 * std::fabs(dg_fd) + 2e-2);
    }
  }
}

double silu_ref(double g) { return g / (1 + std::exp(-g)); }

TEST_F(OpsLlamaTest, SwigluForwardMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (auto [N, F] : {std::pair<int64_t, int64_t>{7, 13}, {1, 1}, {40, 1001}}) {  // the last one threaded
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " F=" + std::to_string(F));
      Vec x = rounded(uniform(N * 2 * F, -6.f, 6.f), dt);
      if (N * F > 1) x[0] = rounded({-40.f}, dt)[0];  // saturated sigmoid
      Tensor tx = make({N, 2 * F}, x, dt), y = be->empty({N, F}, dt);
      be->swiglu_forward(tx, y);
      DVec ref(N * F);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t f = 0; f < F; ++f) ref[n * F + f] = silu_ref(x[n * 2 * F + f]) * x[n * 2 * F + F + f];
      expect_near_vec(host(y), ref, out_tol(dt), out_tol(dt), "y");
    }
  }
}

TEST_F(OpsLlamaTest, SwigluBackwardMatchesFiniteDifferences) {
  const int64_t N = 3, F = 5;
  Vec x = uniform(N * 2 * F, -4.f, 4.f), R = randn(N * F);
  auto f = [&] {
    Tensor tx = make({N, 2 * F}, x), y = be->empty({N, F});
    be->swiglu_forward(tx, y);
    return dot(host(y), R);
  };
  Tensor tx = make({N, 2 * F}, x), dy = make({N, F}, R), dx = make({N, 2 * F}, Vec(N * 2 * F, 9.f));
  be->swiglu_backward(dy, tx, dx);
  EXPECT_LT(rel_err(host(dx), numeric_grad(x, f, 1e-3)), kGradTol);
  // bf16, large and threaded: within bf16 rounding of the fp32 gradient on the same inputs.
  const int64_t N2 = 50, F2 = 999;
  const Vec x2 = rounded(randn(N2 * 2 * F2, 2.f), DType::BF16), R2 = rounded(randn(N2 * F2), DType::BF16);
  Tensor a = make({N2, 2 * F2}, x2), da = make({N2, F2}, R2), g32 = be->empty({N2, 2 * F2});
  be->swiglu_backward(da, a, g32);
  Tensor b = make({N2, 2 * F2}, x2, DType::BF16), db = make({N2, F2}, R2, DType::BF16);
  Tensor g16 = be->empty({N2, 2 * F2}, DType::BF16);
  be->swiglu_backward(db, b, g16);
  const Vec want = host(g32);
  expect_near_vec(host(g16), DVec(want.begin(), want.end()), 1e-2, 8e-3, "bf16 dx");
}

struct RopeCase {
  int64_t B, T, H, G, D, R;
  float base;
  int64_t pos0;
};

// The rotation in double of packed qkv [B*T, (H+2G)*D], with the angles computed as Megatron-LM and Hugging
// Face compute them (fp32 theta and fp32 angle, backend.h); `sign` -1 rotates back.
DVec rope_ref(const Vec& qkv, const RopeCase& c, double sign = 1) {
  DVec out(qkv.begin(), qkv.end());
  const int64_t ld = (c.H + 2 * c.G) * c.D, half = c.R / 2;
  for (int64_t n = 0; n < c.B * c.T; ++n) {
    const int64_t pos = c.pos0 + n % c.T;
    for (int64_t i = 0; i < half; ++i) {
      const float theta = static_cast<float>(1.0 / std::pow(double(c.base), double(float(2 * i) / float(c.R))));
      const float angle = float(pos) * theta;
      const double cs = std::cos(double(angle)), sn = sign * std::sin(double(angle));
      for (int64_t h = 0; h < c.H + c.G; ++h) {
        const int64_t a = n * ld + h * c.D + i, b = a + half;
        out[a] = double(qkv[a]) * cs - double(qkv[b]) * sn;
        out[b] = double(qkv[b]) * cs + double(qkv[a]) * sn;
      }
    }
  }
  return out;
}

const RopeCase kRopeCases[] = {{2, 5, 4, 2, 12, 12, 10000.f, 0},  {1, 7, 3, 1, 16, 8, 10000.f, 3},
                               {3, 4, 2, 2, 10, 6, 500000.f, 100}, {1, 1, 1, 1, 2, 2, 10000.f, 4095},
                               {2, 33, 8, 4, 64, 64, 10000.f, 0}};  // the last one threaded

TEST_F(OpsLlamaTest, RopeForwardAndBackwardMatchReference) {
  for (const RopeCase& c : kRopeCases)
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " H=" + std::to_string(c.H) + " G=" + std::to_string(c.G) +
                   " D=" + std::to_string(c.D) + " R=" + std::to_string(c.R) + " pos0=" + std::to_string(c.pos0));
      const int64_t rows = c.B * c.T, ld = (c.H + 2 * c.G) * c.D;
      const Vec x = rounded(randn(rows * ld), dt);
      Tensor t = make({rows, ld}, x, dt);
      be->rope_forward(t, c.B, c.T, c.H, c.G, c.D, c.R, c.base, c.pos0);
      expect_near_vec(host(t), rope_ref(x, c), out_tol(dt), out_tol(dt), "rope_forward");
      Tensor d = make({rows, ld}, x, dt);
      be->rope_backward(d, c.B, c.T, c.H, c.G, c.D, c.R, c.base, c.pos0);
      expect_near_vec(host(d), rope_ref(x, c, -1), out_tol(dt), out_tol(dt), "rope_backward");
    }
}

// Rows of a sequence started at pos0 are the corresponding rows of a longer sequence from 0 (bit for bit),
// and dims past rotary_dims and the v part are left as they were.
TEST_F(OpsLlamaTest, RopeOffsetsAndUntouchedDims) {
  const int64_t T = 10, H = 4, G = 2, D = 16, R = 10, ld = (H + 2 * G) * D, p0 = 6;
  const Vec x = randn(T * ld);
  Tensor whole = make({T, ld}, x);
  be->rope_forward(whole, 1, T, H, G, D, R, 10000.f, 0);
  Tensor tail = make({T - p0, ld}, Vec(x.begin() + p0 * ld, x.end()));
  be->rope_forward(tail, 1, T - p0, H, G, D, R, 10000.f, p0);
  const Vec w = host(whole), t = host(tail);
  for (int64_t i = 0; i < (T - p0) * ld; ++i) ASSERT_EQ(t[i], w[p0 * ld + i]) << "element " << i;
  for (int64_t n = 0; n < T; ++n)
    for (int64_t c = 0; c < ld; ++c) {
      const bool rotated = c < (H + G) * D && c % D < R;
      if (!rotated) {
        ASSERT_EQ(w[n * ld + c], x[n * ld + c]) << "row " << n << " column " << c;
      } else if (n > 0 && c % D == 0) {
        ASSERT_NE(w[n * ld + c], x[n * ld + c]) << "row " << n << " column " << c;
      }
    }
}

// rope_backward is the transpose of rope_forward: <rope(x), y> == <x, rope_backward(y)>.
TEST_F(OpsLlamaTest, RopeBackwardIsTheTranspose) {
  for (const RopeCase& c : kRopeCases) {
    const int64_t rows = c.B * c.T, ld = (c.H + 2 * c.G) * c.D;
    const Vec x = randn(rows * ld), y = randn(rows * ld);
    Tensor tx = make({rows, ld}, x), ty = make({rows, ld}, y);
    be->rope_forward(tx, c.B, c.T, c.H, c.G, c.D, c.R, c.base, c.pos0);
    be->rope_backward(ty, c.B, c.T, c.H, c.G, c.D, c.R, c.base, c.pos0);
    const double lhs = dot(host(tx), y), rhs = dot(x, host(ty));
    EXPECT_NEAR(lhs, rhs, 1e-5 * (std::fabs(lhs) + 1)) << "D=" << c.D << " R=" << c.R;
  }
}

// The error names the backend, the op and the argument.
void expect_error(const std::function<void()>& f, const std::string& op, const std::string& what) {
  const std::string m = error_of(f);
  EXPECT_NE(m.find("CpuBackend::" + op + ": "), std::string::npos) << m;
  EXPECT_NE(m.find(what), std::string::npos) << m;
}

TEST_F(OpsLlamaTest, LlamaOpsRejectBadArguments) {
  const int64_t T = 3, H = 4, G = 2, D = 8, ld = (H + 2 * G) * D;
  Tensor qkv = be->zeros({T, ld});
  auto rope = [&](int64_t h, int64_t g, int64_t d, int64_t r, float base = 10000.f, int64_t pos0 = 0) {
    return [=, &qkv, this] { be->rope_forward(qkv, 1, T, h, g, d, r, base, pos0); };
  };
  EXPECT_NO_THROW(rope(H, G, D, D)());
  expect_error(rope(H, G, D, 5), "rope_forward", "rotary_dims=5 must be even");
  expect_error(rope(H, G, D, 10), "rope_forward", "rotary_dims=10 must be even and between 2 and the head dim D=8");
  expect_error(rope(H, G, D, 0), "rope_forward", "rotary_dims=0");
  expect_error(rope(H, 3, D, 4), "rope_forward", "G=3 must be positive and divide the query heads H=4");
  expect_error(rope(H, G, D, 4, 0.f), "rope_forward", "base must be positive");
  expect_error(rope(H, G, D, 4, 10000.f, -1), "rope_forward", "pos0");
  expect_error(rope(H, 1, D, 4), "rope_forward", "qkv is [3, 64] fp32 but [B*T, (H+2G)*D]");
  expect_error([&] { be->rope_backward(qkv, 1, T, H, G, D, 3, 10000.f, 0); }, "rope_backward", "rotary_dims=3");
  expect_error([&] { be->rope_backward(qkv, 1, T, H, G, D + 1, 4, 10000.f, 0); }, "rope_backward", "dqkv");

  Tensor x = be->zeros({3, 10}), y = be->empty({3, 5}), y_bad = be->empty({3, 4}), dx = be->empty({3, 10});
  Tensor y16 = be->empty({3, 5}, DType::BF16);
  EXPECT_NO_THROW(be->swiglu_forward(x, y));
  expect_error([&] { be->swiglu_forward(x, y_bad); }, "swiglu_forward", "x [3, 10] fp32 must be [N, 2F] = [3, 8]");
  expect_error([&] { be->swiglu_forward(x, y16); }, "swiglu_forward", "y [3, 5] bf16 must have x's dtype");
  expect_error([&] { be->swiglu_backward(y_bad, x, dx); }, "swiglu_backward", "for dy [3, 4]");
  Tensor dx_bad = be->empty({3, 9});
  expect_error([&] { be->swiglu_backward(y, x, dx_bad); }, "swiglu_backward", "dx is [3, 9] fp32");

  Tensor g = be->zeros({10}), g_bad = be->zeros({9}), rstd = be->empty({3}), rstd_bad = be->empty({2});
  Tensor yn = be->empty({3, 10}), dg = be->zeros({10}), dg16 = be->zeros({10}, DType::BF16);
  EXPECT_NO_THROW(be->rmsnorm_forward(x, g, yn, rstd, 1e-5f));
  expect_error([&] { be->rmsnorm_forward(x, g_bad, yn, rstd, 1e-5f); }, "rmsnorm_forward", "normalised width 9");
  expect_error([&] { be->rmsnorm_forward(x, g, yn, rstd_bad, 1e-5f); }, "rmsnorm_forward", "rstd");
  expect_error([&] { be->rmsnorm_backward(yn, x, g, rstd, dx, dg16); }, "rmsnorm_backward", "dgamma must be fp32");
  expect_error([&] { be->rmsnorm_backward(yn, x, g, rstd, dx_bad, dg); }, "rmsnorm_backward", "dx is [3, 9]");
  Tensor xn = be->empty({3, 10});  // the norms' backward reads x and dy again after writing dx
  expect_error([&] { be->rmsnorm_backward(yn, xn, g, rstd, yn, dg); }, "rmsnorm_backward", "dx must not share");
  expect_error([&] { be->rmsnorm_backward(yn, xn, g, rstd, xn, dg); }, "rmsnorm_backward", "dx must not share");
  Tensor mean = be->empty({3}), db = be->zeros({10});
  expect_error([&] { be->layernorm_backward(yn, xn, g, mean, rstd, yn, dg, db); }, "layernorm_backward",
               "dx must not share");
  // The op's name differs by backend (the CPU's composes layernorm_backward and an add).
  const std::string add_error = error_of([&] { be->layernorm_backward_add(yn, xn, g, mean, rstd, yn, xn, dg, db); });
  EXPECT_NE(add_error.find("dx must not share"), std::string::npos) << add_error;
  Tensor wide = be->empty({4, 10});  // a dx that starts one row into x's storage overlaps it
  Tensor x_rows = wide.slice_elems(0, {3, 10}), dx_rows = wide.slice_elems(10, {3, 10});
  expect_error([&] { be->rmsnorm_backward(yn, x_rows, g, rstd, dx_rows, dg); }, "rmsnorm_backward",
               "dx must not share");
}

}  // namespace
}  // namespace gpt
