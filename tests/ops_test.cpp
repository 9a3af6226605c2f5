// Tests of the CPU backend's math kernels (model/ops/backend.h). Every backward pass is checked against
// central finite differences of a scalar function of its forward pass (sum(out * R) with fixed random R, or
// the loss itself for cross-entropy) taken in double on the host; larger, multi-threaded shapes are checked
// with directional derivatives. Forward values are checked against naive double-precision references
// written here. Also covered: accumulate-vs-overwrite semantics. Attention, cross-entropy and the
// optimizer are in ops_attention_loss_test.cpp, the Llama-style kernels in ops_llama_test.cpp.
#include "tests/ops_test_util.h"

namespace gpt {
namespace {

// ---------------------------------------------------------------------------------------------------
// Linear

DVec linear_ref(const Vec& x, const Vec& w, const Vec* b, int64_t N, int64_t in, int64_t out) {
  DVec y(N * out);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) s += static_cast<double>(x[n * in + i]) * w[o * in + i];
      y[n * out + o] = s;
    }
  return y;
}

TEST_F(OpsTest, LinearForwardMatchesReference) {
  const int64_t N = 37, in = 29, out = 23;
  Vec x = randn(N * in), w = randn(out * in), b = randn(out);
  Tensor tx = make({N, in}, x), tw = make({out, in}, w), tb = make({out}, b);
  Tensor y = be->empty({N, out});
  be->linear_forward(tx, tw, &tb, y);
  expect_near_vec(host(y), linear_ref(x, w, &b, N, in, out), 1e-4, 1e-5, "y with bias");
  be->linear_forward(tx, tw, nullptr, y);
  expect_near_vec(host(y), linear_ref(x, w, nullptr, N, in, out), 1e-4, 1e-5, "y without bias");
}

TEST_F(OpsTest, LinearBackwardMatchesFiniteDifferences) {
  for (bool with_bias : {true, false}) {
    const int64_t N = 4, in = 5, out = 3;
    Vec x = randn(N * in), w = randn(out * in), b = randn(out), R = randn(N * out);
    auto f = [&] {
      Tensor tx = make({N, in}, x), tw = make({out, in}, w), tb = make({out}, b), y = be->empty({N, out});
      be->linear_forward(tx, tw, with_bias ? &tb : nullptr, y);
      return dot(host(y), R);
    };
    Tensor tx = make({N, in}, x), tw = make({out, in}, w), dy = make({N, out}, R);
    Tensor dx = be->empty({N, in}), dw = be->zeros({out, in}), db = be->zeros({out});
    be->linear_backward(dy, tx, tw, &dx, dw, with_bias ? &db : nullptr);
    EXPECT_LT(rel_err(host(dx), numeric_grad(x, f, 1e-2)), kGradTol) << "dx, bias=" << with_bias;
    EXPECT_LT(rel_err(host(dw), numeric_grad(w, f, 1e-2)), kGradTol) << "dw, bias=" << with_bias;
    if (with_bias) {
      EXPECT_LT(rel_err(host(db), numeric_grad(b, f, 1e-2)), kGradTol) << "db";
    }
  }
}

TEST_F(OpsTest, LinearBackwardAccumulatesWeightGradsAndOverwritesDx) {
  // Large enough for the multi-threaded bias-gradient path; checked against a double reference.
  const int64_t N = 300, in = 40, out = 256;
  Vec x = randn(N * in), w = randn(out * in), g = randn(N * out);
  Tensor tx = make({N, in}, x), tw = make({out, in}, w), dy = make({N, out}, g);
  Tensor dx = make({N, in}, Vec(N * in, 7.f));  // stale contents must be overwritten
  Tensor dw = be->zeros({out, in}), db = be->zeros({out});
  be->linear_backward(dy, tx, tw, &dx, dw, &db);
  DVec dx_ref(N * in, 0.0), dw_ref(out * in, 0.0), db_ref(out, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      const double gy = g[n * out + o];
      db_ref[o] += gy;
      for (int64_t i = 0; i < in; ++i) {
        dx_ref[n * in + i] += gy * w[o * in + i];
        dw_ref[o * in + i] += gy * x[n * in + i];
      }
    }
  expect_near_vec(host(dx), dx_ref, 1e-3, 1e-4, "dx");
  expect_near_vec(host(dw), dw_ref, 1e-3, 1e-4, "dw");
  expect_near_vec(host(db), db_ref, 1e-3, 1e-4, "db");
  const Vec dw1 = host(dw), db1 = host(db);
  // Second microbatch: dw and db double, dx is the same (overwritten, not accumulated). The GEMM adds the
  // product to dw with beta = 1 (cpu_matmul.h), so dw doubles up to a few rounding steps.
  Tensor dx2 = be->empty({N, in});
  be->linear_backward(dy, tx, tw, &dx2, dw, &db);
  const Vec dw2 = host(dw), db2 = host(db);
  for (size_t i = 0; i < dw1.size(); ++i) ASSERT_NEAR(dw2[i], 2 * dw1[i], 4e-6 * std::fabs(2 * dw1[i]) + 1e-7) << i;
  for (size_t i = 0; i < db1.size(); ++i) ASSERT_FLOAT_EQ(db2[i], 2 * db1[i]);
  EXPECT_EQ(host(dx2), host(dx));
  // dx may be skipped.
  be->linear_backward(dy, tx, tw, nullptr, dw, nullptr);
  const Vec dw3 = host(dw);
  for (size_t i = 0; i < dw1.size(); ++i) ASSERT_NEAR(dw3[i], 3 * dw1[i], 1e-4 * (1 + std::fabs(dw1[i])));
}

TEST_F(OpsTest, LinearRejectsMismatchedShapes) {
  Tensor x = be->zeros({4, 5}), w = be->zeros({3, 6}), y = be->empty({4, 3});
  EXPECT_THROW(be->linear_forward(x, w, nullptr, y), std::runtime_error);
  Tensor w2 = be->zeros({3, 5}), y2 = be->empty({4, 4});
  EXPECT_THROW(be->linear_forward(x, w2, nullptr, y2), std::runtime_error);
  Tensor ids = be->zeros({4, 5}, DType::I32);
  EXPECT_THROW(be->linear_forward(ids, w2, nullptr, y), std::runtime_error);
}

// Empty products: no rows, and no in-features (y is the bias broadcast over the rows, or zeros).
TEST_F(OpsTest, LinearEmptyShapes) {
  Tensor x = be->zeros({0, 8}), w = make({5, 8}, randn(40)), y = be->empty({0, 5});
  be->linear_forward(x, w, nullptr, y);
  const Vec b = randn(5);
  Tensor x2 = be->zeros({3, 0}), w2 = be->zeros({5, 0}), y2 = be->empty({3, 5}), tb = make({5}, b);
  be->linear_forward(x2, w2, &tb, y2);
  expect_near_vec(host(y2), linear_ref({}, {}, &b, 3, 0, 5), 0, 0, "bias only");
  be->linear_forward(x2, w2, nullptr, y2);
  expect_near_vec(host(y2), DVec(15, 0.0), 0, 0, "no bias");
  Tensor y3 = be->empty({0, 5});
  EXPECT_THROW(be->linear_forward(x2, w2, nullptr, y3), std::runtime_error);  // 3 rows, not 0
}

// ---------------------------------------------------------------------------------------------------
// LayerNorm

TEST_F(OpsTest, LayerNormForwardMatchesReference) {
  const int64_t N = 9, C = 33;
  const float eps = 1e-5f;
  Vec x = randn(N * C, 2.f), g = randn(C), b = randn(C);
  for (int64_t c = 0; c < C; ++c) x[c] += 5.f;  // an offset row, to exercise the mean subtraction
  Tensor tx = make({N, C}, x), tg = make({C}, g), tb = make({C}, b);
  Tensor y = be->empty({N, C}), mean = be->empty({N}), rstd = be->empty({N});
  be->layernorm_forward(tx, tg, tb, y, mean, rstd, eps);
  DVec y_ref(N * C), m_ref(N), r_ref(N);
  for (int64_t n = 0; n < N; ++n) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mu += x[n * C + c];
    mu /= C;
    for (int64_t c = 0; c < C; ++c) var += (x[n * C + c] - mu) * (x[n * C + c] - mu);
    var /= C;
    const double rs = 1.0 / std::sqrt(var + eps);
    m_ref[n] = mu;
    r_ref[n] = rs;
    for (int64_t c = 0; c < C; ++c) y_ref[n * C + c] = (x[n * C + c] - mu) * rs * g[c] + b[c];
  }
  expect_near_vec(host(y), y_ref, 1e-5, 1e-5, "y");
  expect_near_vec(host(mean), m_ref, 1e-5, 1e-6, "mean");
  expect_near_vec(host(rstd), r_ref, 1e-6, 1e-5, "rstd");
}

TEST_F(OpsTest, LayerNormBackwardMatchesFiniteDifferences) {
  const int64_t N = 4, C = 7;
  const float eps = 1e-5f;
  Vec x = randn(N * C), g = randn(C), b = randn(C), R = randn(N * C);
  auto f = [&] {
    Tensor tx = make({N, C}, x), tg = make({C}, g), tb = make({C}, b);
    Tensor y = be->empty({N, C}), mean = be->empty({N}), rstd = be->empty({N});
    be->layernorm_forward(tx, tg, tb, y, mean, rstd, eps);
    return dot(host(y), R);
  };
  Tensor tx = make({N, C}, x), tg = make({C}, g), tb = make({C}, b);
  Tensor y = be->empty({N, C}), mean = be->empty({N}), rstd = be->empty({N});
  be->layernorm_forward(tx, tg, tb, y, mean, rstd, eps);
  // dgamma / dbeta start non-zero: they must accumulate on top.
  const Vec g0 = randn(C), b0 = randn(C);
  Tensor dy = make({N, C}, R), dx = be->empty({N, C}), dg = make({C}, g0), db = make({C}, b0);
  be->layernorm_backward(dy, tx, tg, mean, rstd, dx, dg, db);
  Vec dgv = host(dg), dbv = host(db);
  for (int64_t c = 0; c < C; ++c) {
    dgv[c] -= g0[c];
    dbv[c] -= b0[c];
  }
  EXPECT_LT(rel_err(host(dx), numeric_grad(x, f, 3e-3)), kGradTol) << "dx";
  EXPECT_LT(rel_err(dgv, numeric_grad(g, f, 3e-3)), kGradTol) << "dgamma";
  EXPECT_LT(rel_err(dbv, numeric_grad(b, f, 3e-3)), kGradTol) << "dbeta";
}

// The residual add before a LayerNorm (Backend::add_layernorm_forward, layernorm_backward_add) against a
// double reference of the chain: h = x + r kept, y = LayerNorm(h); dx = LayerNorm's input gradient at h +
// dres, with dgamma, dbeta accumulated.
TEST_F(OpsTest, AddLayerNormMatchesReference) {
  const int64_t N = 5, C = 37;
  const double eps = 1e-5;
  const Vec x = randn(N * C), r = randn(N * C), g = randn(C), b = randn(C), dyv = randn(N * C), dresv = randn(N * C);
  Tensor tx = make({N, C}, x), tr = make({N, C}, r), tg = make({C}, g), tb = make({C}, b);
  Tensor h = be->empty({N, C}), y = be->empty({N, C}), mean = be->empty({N}), rstd = be->empty({N});
  be->add_layernorm_forward(tx, tr, tg, tb, h, y, mean, rstd, static_cast<float>(eps));
  Tensor dy = make({N, C}, dyv), dres = make({N, C}, dresv), dx = be->empty({N, C});
  Tensor dg = be->zeros({C}), db = be->zeros({C});
  be->layernorm_backward_add(dy, h, tg, mean, rstd, dres, dx, dg, db);

  DVec h_ref(N * C), y_ref(N * C), dx_ref(N * C), dg_ref(C, 0.0), db_ref(C, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t o = n * C;
    double mu = 0, var = 0, mean_g = 0, mean_gx = 0;
    for (int64_t c = 0; c < C; ++c) mu += h_ref[o + c] = double(x[o + c]) + r[o + c];
    mu /= C;
    for (int64_t c = 0; c < C; ++c) var += (h_ref[o + c] - mu) * (h_ref[o + c] - mu);
    const double rs = 1.0 / std::sqrt(var / C + eps);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (h_ref[o + c] - mu) * rs, gc = double(dyv[o + c]) * g[c];
      y_ref[o + c] = xhat * g[c] + b[c];
      mean_g += gc / C;
      mean_gx += gc * xhat / C;
      dg_ref[c] += dyv[o + c] * xhat;
      db_ref[c] += dyv[o + c];
    }
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (h_ref[o + c] - mu) * rs, gc = double(dyv[o + c]) * g[c];
      dx_ref[o + c] = rs * (gc - mean_g - xhat * mean_gx) + dresv[o + c];
    }
  }
  expect_near_vec(host(h), h_ref, 1e-6, 1e-6, "h");
  expect_near_vec(host(y), y_ref, 1e-5, 1e-5, "y");
  expect_near_vec(host(dx), dx_ref, 1e-5, 1e-5, "dx = layernorm's dx + dres");
  expect_near_vec(host(dg), dg_ref, 1e-5, 1e-5, "dgamma");
  expect_near_vec(host(db), db_ref, 1e-5, 1e-5, "dbeta");
}

TEST_F(OpsTest, LayerNormBackwardLargeMatchesDirectionalDerivative) {
  const int64_t N = 96, C = 384;  // multi-threaded path with per-thread gamma/beta partial sums
  const float eps = 1e-5f;
  Vec x = randn(N * C), g = randn(C), b = randn(C), R = randn(N * C);
  auto f = [&] {
    Tensor tx = make({N, C}, x), tg = make({C}, g), tb = make({C}, b);
    Tensor y = be->empty({N, C}), mean = be->empty({N}), rstd = be->empty({N});
    be->layernorm_forward(tx, tg, tb, y, mean, rstd, eps);
    return dot(host(y), R);
  };
  Tensor tx = make({N, C}, x), tg = make({C}, g), tb = make({C}, b);
  Tensor y = be->empty({N, C}), mean = be->empty({N}), rstd = be->empty({N});
  be->layernorm_forward(tx, tg, tb, y, mean, rstd, eps);
  Tensor dy = make({N, C}, R), dx = be->empty({N, C}), dg = be->zeros({C}), db = be->zeros({C});
  be->layernorm_backward(dy, tx, tg, mean, rstd, dx, dg, db);
  Vec ux = randn(N * C), ug = randn(C), ub = randn(C);
  const double dx_fd = directional_fd(x, ux, f, 1e-3);
  EXPECT_NEAR(dot(host(dx), ux), dx_fd, 1e-3 * std::fabs(dx_fd) + 2e-2);
  const double dg_fd = directional_fd(g, ug, f, 1e-3);
  EXPECT_NEAR(dot(host(dg), ug), dg_fd, 1e-3 * std::fabs(dg_fd) + 2e-2);
  const double db_fd = directional_fd(b, ub, f, 1e-3);
  EXPECT_NEAR(dot(host(db), ub), db_fd, 1e-3 * std::fabs(db_fd) + 2e-2);
}

// ---------------------------------------------------------------------------------------------------
// GELU

double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

TEST_F(OpsTest, GeluForwardMatchesReference) {
  Vec x = uniform(100001, -9.f, 9.f);  // odd length, large enough to run threaded
  x[0] = 0.f, x[1] = 1e-4f, x[2] = -30.f, x[3] = 30.f;
  Tensor tx = make({int64_t(x.size())}, x), y = be->empty({int64_t(x.size())});
  be->gelu_forward(tx, y);
  DVec ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = gelu_ref(x[i]);
  expect_near_vec(host(y), ref, 2e-6, 2e-6, "gelu");
}

TEST_F(OpsTest, GeluBackwardMatchesFiniteDifferences) {
  Vec x = uniform(40, -4.f, 4.f), R = randn(40);
  auto f = [&] {
    Tensor tx = make({40}, x), y = be->empty({40});
    be->gelu_forward(tx, y);
    return dot(host(y), R);
  };
  Tensor tx = make({40}, x), dy = make({40}, R), dx = be->empty({40});
  be->gelu_backward(dy, tx, dx);
  EXPECT_LT(rel_err(host(dx), numeric_grad(x, f, 3e-3)), kGradTol);
  // And pointwise against the analytic derivative of the double reference (central differences in double).
  const Vec dxv = host(dx);
  for (int i = 0; i < 40; ++i) {
    const double d = (gelu_ref(x[i] + 1e-6) - gelu_ref(x[i] - 1e-6)) / 2e-6;
    EXPECT_NEAR(dxv[i], R[i] * d, 1e-5 * (1 + std::fabs(R[i])));
  }
}

// The MLP's linears with GELU between them (Backend::linear_gelu_forward, linear_dgelu_backward) against
// double references of the chain: pre = x w^T + b, act = gelu(pre); dpre = (dy w) * gelu'(pre), and fc2's
// weight and bias gradients accumulated as linear_backward does.
TEST_F(OpsTest, LinearGeluForwardAndBackwardMatchReference) {
  const int64_t N = 13, in = 24, ffn = 40, out = 24;
  const Vec x = randn(N * in), w1 = randn(ffn * in, 0.3f), b1 = randn(ffn), w2 = randn(out * ffn, 0.3f);
  Tensor tx = make({N, in}, x), tw1 = make({ffn, in}, w1), tb1 = make({ffn}, b1), tw2 = make({out, ffn}, w2);
  Tensor pre = be->empty({N, ffn}), act = be->empty({N, ffn});
  be->linear_gelu_forward(tx, tw1, &tb1, pre, act);
  const DVec pre_ref = linear_ref(x, w1, &b1, N, in, ffn);
  DVec act_ref(pre_ref.size());
  for (size_t i = 0; i < pre_ref.size(); ++i) act_ref[i] = gelu_ref(pre_ref[i]);
  expect_near_vec(host(pre), pre_ref, 1e-4, 1e-5, "pre");
  expect_near_vec(host(act), act_ref, 1e-4, 1e-5, "act");

  const Vec dy = randn(N * out), dw0 = randn(out * ffn, 0.1f), db0 = randn(out, 0.1f);
  Tensor tdy = make({N, out}, dy), dpre = be->empty({N, ffn}), dw = make({out, ffn}, dw0), db = make({out}, db0);
  be->linear_dgelu_backward(tdy, act, tw2, pre, dpre, dw, &db);
  const Vec actv = host(act), prev = host(pre);
  DVec dpre_ref(N * ffn), dw_ref(dw0.begin(), dw0.end()), db_ref(db0.begin(), db0.end());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < ffn; ++f) {
      double s = 0;
      for (int64_t o = 0; o < out; ++o) s += double(dy[n * out + o]) * w2[o * ffn + f];
      const double p = prev[n * ffn + f];
      dpre_ref[n * ffn + f] = s * (gelu_ref(p + 1e-6) - gelu_ref(p - 1e-6)) / 2e-6;
    }
  for (int64_t o = 0; o < out; ++o)
    for (int64_t n = 0; n < N; ++n) {
      db_ref[o] += dy[n * out + o];
      for (int64_t f = 0; f < ffn; ++f) dw_ref[o * ffn + f] += double(dy[n * out + o]) * actv[n * ffn + f];
    }
  expect_near_vec(host(dpre), dpre_ref, 1e-4, 1e-4, "dpre");
  expect_near_vec(host(dw), dw_ref, 1e-4, 1e-5, "dw (accumulated)");
  expect_near_vec(host(db), db_ref, 1e-5, 1e-5, "db (accumulated)");
}

// ---------------------------------------------------------------------------------------------------
// Residual add / accumulate / scale

TEST_F(OpsTest, AddAndAccumulateMatchFiniteDifferences) {
  const int64_t n = 30;
  Vec a = randn(n), b = randn(n), R = randn(n);
  auto f = [&] {
    Tensor ta = make({n}, a), tb = make({n}, b), out = be->empty({n});
    be->add(ta, tb, out);
    return dot(host(out), R);
  };
  {
    Tensor ta = make({n}, a), tb = make({n}, b), out = be->empty({n});
    be->add(ta, tb, out);
    const Vec o = host(out);
    for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(o[i], a[i] + b[i]);
  }
  // The residual backward: the upstream gradient is accumulated into both branches' gradients.
  Tensor dout = make({n}, R), da = be->zeros({n}), db = be->zeros({n});
  be->accumulate(dout, da);
  be->accumulate(dout, db);
  EXPECT_LT(rel_err(host(da), numeric_grad(a, f, 1e-2)), 1e-4);
  EXPECT_LT(rel_err(host(db), numeric_grad(b, f, 1e-2)), 1e-4);
  // Accumulating twice doubles.
  be->accumulate(dout, da);
  const Vec dav = host(da);
  for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(dav[i], 2 * R[i]);
}

TEST_F(OpsTest, AccumulateAndScaleLarge) {
  const int64_t n = 200003;
  Vec a = randn(n), b = randn(n);
  Tensor ta = make({n}, a), tb = make({n}, b);
  be->accumulate(ta, tb);
  be->scale(tb, -0.5f);
  const Vec r = host(tb);
  for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(r[i], -0.5f * (a[i] + b[i]));
}

// ---------------------------------------------------------------------------------------------------
// Embeddings

TEST_F(OpsTest, EmbeddingForwardSelectsRowsOfThisShard) {
  const int64_t C = 6, start = 4, rows = 5;  // this shard holds ids 4..8 of a larger vocabulary
  Vec table = randn(rows * C);
  std::vector<int32_t> ids = {4, 0, 8, 9, 6, 4, 3};
  Tensor tt = make({rows, C}, table), ti = make_ids({7}, ids), out = make({7, C}, Vec(7 * C, 3.f));
  be->embedding_forward(ti, tt, start, out);
  const Vec o = host(out);
  for (size_t n = 0; n < ids.size(); ++n)
    for (int64_t c = 0; c < C; ++c) {
      const int64_t local = ids[n] - start;
      const float want = (local >= 0 && local < rows) ? table[local * C + c] : 0.f;
      ASSERT_EQ(o[n * C + c], want) << "token " << n;
    }
  std::vector<int32_t> bad = {1, -2};
  Tensor tbad = make_ids({2}, bad), out2 = be->empty({2, C});
  EXPECT_THROW(be->embedding_forward(tbad, tt, start, out2), std::runtime_error);
}

TEST_F(OpsTest, EmbeddingBackwardMatchesFiniteDifferencesAcrossShards) {
  // The full table is split into two vocab shards; each shard's gradient must match FD of the summed
  // output (what the tensor-parallel all-reduce of the two partial embeddings computes).
  const int64_t V = 9, C = 4, split = 5, N = 8;
  Vec table = randn(V * C), R = randn(N * C);
  std::vector<int32_t> ids = {0, 4, 5, 8, 4, 4, 2, 7};  // repeats and both sides of the split
  auto shard = [&](int s) { return s == 0 ? std::pair<int64_t, int64_t>{0, split} : std::pair<int64_t, int64_t>{split, V - split}; };
  auto f = [&] {
    Tensor ti = make_ids({N}, ids);
    Vec total(N * C, 0.f);
    for (int s = 0; s < 2; ++s) {
      auto [start, rows] = shard(s);
      Tensor tt = make({rows, C}, Vec(table.begin() + start * C, table.begin() + (start + rows) * C));
      Tensor out = be->empty({N, C});
      be->embedding_forward(ti, tt, start, out);
      const Vec o = host(out);
      for (int64_t i = 0; i < N * C; ++i) total[i] += o[i];
    }
    return dot(total, R);
  };
  Vec grad(V * C);
  Tensor ti = make_ids({N}, ids), dout = make({N, C}, R);
  for (int s = 0; s < 2; ++s) {
    auto [start, rows] = shard(s);
    Tensor dt = be->zeros({rows, C});
    be->embedding_backward(ti, dout, start, dt);
    const Vec d = host(dt);
    std::copy(d.begin(), d.end(), grad.begin() + start * C);
  }
  EXPECT_LT(rel_err(grad, numeric_grad(table, f, 1e-2)), 1e-4);
  // Row 1 (id never seen) must have no gradient; row 4 collects three tokens.
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(grad[1 * C + c], 0.f);
  for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(grad[4 * C + c], R[1 * C + c] + R[4 * C + c] + R[5 * C + c], 1e-6);
}

TEST_F(OpsTest, EmbeddingBackwardLargeAccumulates) {
  const int64_t V = 50, C = 256, N = 400;  // threaded over columns
  std::vector<int32_t> ids(N);
  std::uniform_int_distribution<int> pick(0, V - 1);
  for (auto& id : ids) id = pick(rng);
  Vec R = randn(N * C), init = randn(V * C);
  Tensor ti = make_ids({N}, ids), dout = make({N, C}, R), dt = make({V, C}, init);
  be->embedding_backward(ti, dout, 0, dt);
  DVec ref(init.begin(), init.end());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) ref[ids[n] * C + c] += R[n * C + c];
  expect_near_vec(host(dt), ref, 1e-5, 1e-5, "dtable");
}

TEST_F(OpsTest, AddPositionsMatchesFiniteDifferences) {
  const int64_t B = 3, T = 4, C = 5, maxT = 6;  // the table is longer than the sequence
  Vec pos = randn(maxT * C), base = randn(B * T * C), R = randn(B * T * C);
  auto f = [&] {
    Tensor tp = make({maxT, C}, pos), out = make({B * T, C}, base);
    be->add_positions(tp, T, out);
    return dot(host(out), R);
  };
  {
    Tensor tp = make({maxT, C}, pos), out = make({B * T, C}, base);
    be->add_positions(tp, T, out);
    const Vec o = host(out);
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t c = 0; c < C; ++c) ASSERT_FLOAT_EQ(o[r * C + c], base[r * C + c] + pos[(r % T) * C + c]);
  }
  Tensor dout = make({B * T, C}, R), dpos = be->zeros({maxT, C});
  be->add_positions_backward(dout, T, dpos);
  EXPECT_LT(rel_err(host(dpos), numeric_grad(pos, f, 1e-2)), 1e-4);
  // Rows past T get nothing; a second call accumulates.
  const Vec d1 = host(dpos);
  for (int64_t i = T * C; i < maxT * C; ++i) EXPECT_EQ(d1[i], 0.f);
  be->add_positions_backward(dout, T, dpos);
  const Vec d2 = host(dpos);
  for (size_t i = 0; i < d1.size(); ++i) ASSERT_FLOAT_EQ(d2[i], 2 * d1[i]);
  Tensor tp = make({maxT, C}, pos), out = be->zeros({B * 7, C});
  EXPECT_THROW(be->add_positions(tp, 7, out), std::runtime_error);  // T past the table
}

}  // namespace
}  // namespace gpt
