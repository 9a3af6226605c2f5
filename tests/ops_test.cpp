// Tests of the CPU backend's math kernels (model/ops/backend.h). Every backward pass is checked against
// central finite differences of a scalar function of its forward pass (sum(out * R) with fixed random R, or
// the loss itself for cross-entropy) taken in double on the host; larger, multi-threaded shapes are checked
// with directional derivatives. Forward values are checked against naive double-precision references
// written here. Also covered: accumulate-vs-overwrite semantics, AdamW against a double reference, sum of
// squares.
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

// The residual add before a LayerNorm (Backend::add_layernorm_forward, layernorm_backward_add): the sum is
// kept, the norm is of the sum, and the residual's gradient is added to the norm's input gradient.
TEST_F(OpsTest, AddLayerNormMatchesSeparateOps) {
  const int64_t N = 5, C = 37;
  const Vec x = randn(N * C), r = randn(N * C), g = randn(C), b = randn(C), dyv = randn(N * C), dresv = randn(N * C);
  Tensor tx = make({N, C}, x), tr = make({N, C}, r), tg = make({C}, g), tb = make({C}, b);
  Tensor h = be->empty({N, C}), y = be->empty({N, C}), mean = be->empty({N}), rstd = be->empty({N});
  be->add_layernorm_forward(tx, tr, tg, tb, h, y, mean, rstd, 1e-5f);
  DVec h_ref(N * C);
  for (int64_t i = 0; i < N * C; ++i) h_ref[i] = double(x[i]) + r[i];
  expect_near_vec(host(h), h_ref, 1e-6, 1e-6, "h");
  Tensor h2 = make({N, C}, host(h)), y2 = be->empty({N, C}), m2 = be->empty({N}), r2 = be->empty({N});
  be->layernorm_forward(h2, tg, tb, y2, m2, r2, 1e-5f);
  EXPECT_EQ(host(y), host(y2));
  Tensor dy = make({N, C}, dyv), dres = make({N, C}, dresv), dx = be->empty({N, C});
  Tensor dg = be->zeros({C}), db = be->zeros({C}), dx2 = be->empty({N, C}), dg2 = be->zeros({C}), db2 = be->zeros({C});
  be->layernorm_backward_add(dy, h, tg, mean, rstd, dres, dx, dg, db);
  be->layernorm_backward(dy, h, tg, mean, rstd, dx2, dg2, db2);
  const Vec dxv = host(dx), dx2v = host(dx2);
  DVec want(N * C);
  for (int64_t i = 0; i < N * C; ++i) want[i] = double(dx2v[i]) + dresv[i];
  expect_near_vec(dxv, want, 1e-6, 1e-6, "dx = layernorm's dx + dres");
  EXPECT_EQ(host(dg), host(dg2));
  EXPECT_EQ(host(db), host(db2));
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

// ---------------------------------------------------------------------------------------------------
// Attention

// Naive causal attention in double: returns out [B*T, H*D] and fills probs [B, H, T, T].
DVec attention_ref(const Vec& qkv, int64_t B, int64_t T, int64_t H, int64_t D, DVec& probs) {
  DVec out(B * T * H * D, 0.0);
  probs.assign(B * H * T * T, 0.0);
  const int64_t ld = 3 * H * D;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        auto q = [&](int64_t d) { return double(qkv[(b * T + i) * ld + h * D + d]); };
        DVec s(i + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += q(d) * qkv[(b * T + j) * ld + H * D + h * D + d];
          s[j] = acc / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int64_t j = 0; j <= i; ++j) {
          const double p = s[j] / sum;
          probs[((b * H + h) * T + i) * T + j] = p;
          for (int64_t d = 0; d < D; ++d)
            out[(b * T + i) * H * D + h * D + d] += p * qkv[(b * T + j) * ld + 2 * H * D + h * D + d];
        }
      }
  return out;
}

struct AttnCase {
  int64_t B, T, H, D;
};

TEST_F(OpsTest, AttentionForwardMatchesReference) {
  // T = 130 spans three query blocks of the kernel, the last one partial.
  for (AttnCase c : {AttnCase{2, 5, 2, 3}, AttnCase{1, 130, 3, 8}, AttnCase{2, 64, 1, 16}}) {
    Vec qkv = randn(c.B * c.T * 3 * c.H * c.D);
    Tensor tq = make({c.B * c.T, 3 * c.H * c.D}, qkv);
    Tensor out = be->empty({c.B * c.T, c.H * c.D}), lse = make({c.B, c.H, c.T}, Vec(c.B * c.H * c.T, 9.f));
    be->attention_forward(tq, c.B, c.T, c.H, c.H, c.D, out, lse);
    DVec probs_ref;
    const DVec out_ref = attention_ref(qkv, c.B, c.T, c.H, c.D, probs_ref);
    expect_near_vec(host(out), out_ref, 2e-6, 1e-5, "attention out");
  }
}

TEST_F(OpsTest, AttentionBackwardMatchesFiniteDifferences) {
  for (AttnCase c : {AttnCase{2, 5, 2, 3}, AttnCase{1, 70, 2, 3}}) {
    const int64_t rows = c.B * c.T, width = 3 * c.H * c.D;
    Vec qkv = randn(rows * width), R = randn(rows * c.H * c.D);
    auto f = [&] {
      Tensor tq = make({rows, width}, qkv), out = be->empty({rows, c.H * c.D});
      Tensor lse = be->empty({c.B, c.H, c.T});
      be->attention_forward(tq, c.B, c.T, c.H, c.H, c.D, out, lse);
      return dot(host(out), R);
    };
    Tensor tq = make({rows, width}, qkv), out = be->empty({rows, c.H * c.D});
    Tensor lse = be->empty({c.B, c.H, c.T});
    be->attention_forward(tq, c.B, c.T, c.H, c.H, c.D, out, lse);
    Tensor dout = make({rows, c.H * c.D}, R), dqkv = make({rows, width}, Vec(rows * width, 5.f));
    be->attention_backward(dout, tq, out, lse, c.B, c.T, c.H, c.H, c.D, dqkv);
    EXPECT_LT(rel_err(host(dqkv), numeric_grad(qkv, f, 3e-3)), kGradTol) << "T=" << c.T;
  }
}

TEST_F(OpsTest, AttentionBackwardLargeMatchesDirectionalDerivative) {
  const AttnCase c{3, 150, 4, 16};  // many (b, h) tasks spread over threads
  const int64_t rows = c.B * c.T, width = 3 * c.H * c.D;
  Vec qkv = randn(rows * width), R = randn(rows * c.H * c.D);
  auto f = [&] {
    Tensor tq = make({rows, width}, qkv), out = be->empty({rows, c.H * c.D});
    Tensor lse = be->empty({c.B, c.H, c.T});
    be->attention_forward(tq, c.B, c.T, c.H, c.H, c.D, out, lse);
    return dot(host(out), R);
  };
  Tensor tq = make({rows, width}, qkv), out = be->empty({rows, c.H * c.D});
  Tensor lse = be->empty({c.B, c.H, c.T});
  be->attention_forward(tq, c.B, c.T, c.H, c.H, c.D, out, lse);
  Tensor dout = make({rows, c.H * c.D}, R), dqkv = be->empty({rows, width});
  be->attention_backward(dout, tq, out, lse, c.B, c.T, c.H, c.H, c.D, dqkv);
  const Vec g = host(dqkv);
  // Separate directions for the q, k and v parts so each part of dqkv is tested on its own.
  for (int part = 0; part < 3; ++part) {
    Vec u(rows * width, 0.f);
    std::normal_distribution<float> nd;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = part * c.H * c.D; k < (part + 1) * c.H * c.D; ++k) u[r * width + k] = nd(rng);
    const double fd = directional_fd(qkv, u, f, 1e-3);
    EXPECT_NEAR(dot(g, u), fd, 2e-3 * std::fabs(fd) + 2e-2) << "part " << part;
  }
}


// ---------------------------------------------------------------------------------------------------
// Cross-entropy

// Loss of a vocab-sharded logits matrix computed the way the model does it: per-shard row max, combined
// by hand (the all-reduce max), per-shard sum_exp and target logit, summed by hand (the all-reduce sum).
struct CeShard {
  int64_t start, cols;  // first global id and columns (incl. padding) of this shard
};

TEST_F(OpsTest, CrossEntropyShardedPipelineMatchesReferenceAndFiniteDifferences) {
  const int64_t N = 4, vocab = 10;
  const std::vector<CeShard> shards = {{0, 6}, {6, 6}};  // padded to 12: ids 10, 11 are padding
  const int64_t padded = 12;
  Vec logits = randn(N * padded, 2.f);
  for (int64_t n = 0; n < N; ++n) logits[n * padded + 10] = logits[n * padded + 11] = 50.f;  // must be ignored
  const std::vector<int32_t> targets = {3, 9, 6, 0};
  const float grad_scale = 1.f / N;

  // Logits of shard s from the full matrix.
  auto shard_logits = [&](const CeShard& s) {
    Vec v(N * s.cols);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < s.cols; ++c) v[n * s.cols + c] = logits[n * padded + s.start + c];
    return v;
  };
  Tensor tt = make_ids({N}, targets);
  // Runs the three forward stages; returns the mean loss and leaves the combined max and sum for backward.
  auto loss = [&](Vec& row_max, Vec& sum_exp) {
    row_max.assign(N, -std::numeric_limits<float>::infinity());
    for (const auto& s : shards) {
      Tensor tl = make({N, s.cols}, shard_logits(s)), mx = be->empty({N});
      be->ce_row_max(tl, s.start, vocab, mx);
      const Vec m = host(mx);
      for (int64_t n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], m[n]);
    }
    sum_exp.assign(N, 0.f);
    Vec target_logit(N, 0.f);
    for (const auto& s : shards) {
      Tensor tl = make({N, s.cols}, shard_logits(s)), mx = make({N}, row_max);
      Tensor se = be->empty({N}), tgt = be->empty({N});
      be->ce_sum_exp(tl, mx, tt, s.start, vocab, se, tgt);
      const Vec sv = host(se), tv = host(tgt);
      for (int64_t n = 0; n < N; ++n) {
        sum_exp[n] += sv[n];
        target_logit[n] += tv[n];
      }
    }
    double total = 0;
    for (int64_t n = 0; n < N; ++n) total += std::log(double(sum_exp[n])) + row_max[n] - target_logit[n];
    return total / N;
  };
  Vec row_max, sum_exp;
  const double got = loss(row_max, sum_exp);

  // Reference: log-softmax over the real columns, in double.
  double ref = 0;
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int64_t c = 0; c < vocab; ++c) mx = std::max(mx, double(logits[n * padded + c]));
    for (int64_t c = 0; c < vocab; ++c) s += std::exp(logits[n * padded + c] - mx);
    ref += std::log(s) + mx - logits[n * padded + targets[n]];
  }
  ref /= N;
  EXPECT_NEAR(got, ref, 1e-5 * std::fabs(ref));

  // Backward per shard with the combined statistics, stitched back into the full layout.
  Vec grad(N * padded);
  for (const auto& s : shards) {
    Tensor tl = make({N, s.cols}, shard_logits(s)), mx = make({N}, row_max), se = make({N}, sum_exp);
    Tensor dl = make({N, s.cols}, Vec(N * s.cols, 4.f));
    be->ce_backward(tl, mx, se, tt, s.start, vocab, grad_scale, dl);
    const Vec d = host(dl);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < s.cols; ++c) grad[n * padded + s.start + c] = d[n * s.cols + c];
  }
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(grad[n * padded + 10], 0.f) << "padding column";
    EXPECT_EQ(grad[n * padded + 11], 0.f) << "padding column";
  }
  Vec unused_max, unused_sum;
  const DVec fd = numeric_grad(logits, [&] { return loss(unused_max, unused_sum); }, 1e-2);
  EXPECT_LT(rel_err(grad, fd), kGradTol);
  // Row sums of the gradient are zero (softmax minus one-hot).
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t c = 0; c < padded; ++c) s += grad[n * padded + c];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
}

TEST_F(OpsTest, CrossEntropyShardWithOnlyPadding) {
  // With a large padding, the last shard may hold no real ids at all.
  const int64_t N = 3, cols = 4, start = 8, vocab = 8;
  Tensor tl = make({N, cols}, randn(N * cols)), mx = be->empty({N});
  Tensor tt = make_ids({N}, {1, 7, 0});
  be->ce_row_max(tl, start, vocab, mx);
  for (float m : host(mx)) EXPECT_EQ(m, -std::numeric_limits<float>::infinity());
  Tensor gmax = make({N}, {1.f, 2.f, 3.f}), se = be->empty({N}), tgt = be->empty({N});
  be->ce_sum_exp(tl, gmax, tt, start, vocab, se, tgt);
  for (float v : host(se)) EXPECT_EQ(v, 0.f);
  for (float v : host(tgt)) EXPECT_EQ(v, 0.f);
  Tensor gsum = make({N}, {1.f, 1.f, 1.f}), dl = be->empty({N, cols});
  be->ce_backward(tl, gmax, gsum, tt, start, vocab, 1.f, dl);
  for (float v : host(dl)) EXPECT_EQ(v, 0.f);
}

TEST_F(OpsTest, CrossEntropyLargeVocabMatchesReference) {
  const int64_t N = 6, vocab = 50257, padded = 50304;  // GPT-2 sizes, threaded rows, padding ignored
  Vec logits = randn(N * padded, 3.f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = vocab; c < padded; ++c) logits[n * padded + c] = 1e4f;
  std::vector<int32_t> targets = {0, 50256, 17, 4242, 50000, 1};
  Tensor tl = make({N, padded}, logits), tt = make_ids({N}, targets), mx = be->empty({N});
  Tensor se = be->empty({N}), tgt = be->empty({N}), dl = be->empty({N, padded});
  be->ce_row_max(tl, 0, vocab, mx);
  be->ce_sum_exp(tl, mx, tt, 0, vocab, se, tgt);
  be->ce_backward(tl, mx, se, tt, 0, vocab, 0.5f, dl);
  const Vec m = host(mx), s = host(se), t = host(tgt), d = host(dl);
  for (int64_t n = 0; n < N; ++n) {
    double rmax = -1e300, rsum = 0;
    for (int64_t c = 0; c < vocab; ++c) rmax = std::max(rmax, double(logits[n * padded + c]));
    for (int64_t c = 0; c < vocab; ++c) rsum += std::exp(logits[n * padded + c] - rmax);
    EXPECT_EQ(m[n], float(rmax));
    EXPECT_NEAR(s[n], rsum, 1e-5 * rsum);
    EXPECT_EQ(t[n], logits[n * padded + targets[n]]);
    for (int64_t c = 0; c < padded; ++c) {
      const double p = c < vocab ? std::exp(logits[n * padded + c] - rmax) / rsum : 0.0;
      const double want = 0.5 * (p - (c == targets[n] ? 1.0 : 0.0));
      ASSERT_NEAR(d[n * padded + c], want, 1e-7 + 1e-5 * std::fabs(want)) << "row " << n << " col " << c;
    }
  }
}

TEST_F(OpsTest, CrossEntropyRejectsTargetsOutsideVocabulary) {
  Tensor tl = make({2, 4}, randn(8)), mx = make({2}, {0.f, 0.f}), se = be->empty({2}), tgt = be->empty({2});
  Tensor tt = make_ids({2}, {1, 4});  // 4 is padding of a vocabulary of 4
  EXPECT_THROW(be->ce_sum_exp(tl, mx, tt, 0, 4, se, tgt), std::runtime_error);
  Tensor neg = make_ids({2}, {-1, 0});
  EXPECT_THROW(be->ce_sum_exp(tl, mx, neg, 0, 4, se, tgt), std::runtime_error);
}

// ---------------------------------------------------------------------------------------------------
// Optimizer

TEST_F(OpsTest, AdamWMatchesDoubleReference) {
  const int64_t n = 1000;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  Vec w = randn(n), m(n, 0.f), v(n, 0.f);
  DVec rw(w.begin(), w.end()), rm(n, 0.0), rv(n, 0.0);
  Tensor tw = make({n}, w), tm = be->zeros({n}), tv = be->zeros({n});
  for (int step = 1; step <= 4; ++step) {
    const Vec g = randn(n);
    Tensor tg = make({n}, g);
    be->adamw_step(tw, tg, tm, tv, lr, b1, b2, eps, wd, step);
    for (int64_t i = 0; i < n; ++i) {
      rm[i] = b1 * rm[i] + (1 - double(b1)) * g[i];
      rv[i] = b2 * rv[i] + (1 - double(b2)) * g[i] * double(g[i]);
      const double mhat = rm[i] / (1 - std::pow(double(b1), step));
      const double vhat = rv[i] / (1 - std::pow(double(b2), step));
      rw[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * rw[i]);
    }
  }
  expect_near_vec(host(tw), rw, 1e-6, 1e-5, "w");
  expect_near_vec(host(tm), rm, 1e-6, 1e-5, "m");
  expect_near_vec(host(tv), rv, 1e-7, 1e-5, "v");
  Tensor w16 = be->zeros({n}, DType::BF16), tg = be->zeros({n});
  EXPECT_THROW(be->adamw_step(w16, tg, tm, tv, lr, b1, b2, eps, wd, 1), std::runtime_error);
  EXPECT_THROW(be->adamw_step(tw, tg, tm, tv, lr, b1, b2, eps, wd, 0), std::runtime_error);
}

TEST_F(OpsTest, SumSquaresIsExactInDouble) {
  const int64_t n = 300007;
  Vec x = randn(n, 3.f);
  double ref = 0;
  for (float v : x) ref += double(v) * v;
  Tensor t = make({n}, x);
  EXPECT_NEAR(be->sum_squares(t), ref, 1e-12 * ref);
  EXPECT_EQ(be->sum_squares(t), be->sum_squares(t));  // reproducible
  Tensor small = make({3}, {1.f, -2.f, 3.f});
  EXPECT_EQ(be->sum_squares(small), 14.0);
}

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

TEST_F(OpsTest, RmsNormForwardMatchesReference) {
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
TEST_F(OpsTest, RmsNormBackwardMatchesFiniteDifferences) {
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

TEST_F(OpsTest, SwigluForwardMatchesReference) {
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

TEST_F(OpsTest, SwigluBackwardMatchesFiniteDifferences) {
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

TEST_F(OpsTest, RopeForwardAndBackwardMatchReference) {
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
TEST_F(OpsTest, RopeOffsetsAndUntouchedDims) {
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
TEST_F(OpsTest, RopeBackwardIsTheTranspose) {
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
  try {
    f();
    ADD_FAILURE() << "no error for " << op << " (" << what << ")";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("CpuBackend::" + op + ": "), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  }
}

TEST_F(OpsTest, LlamaOpsRejectBadArguments) {
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
}

}  // namespace
}  // namespace gpt
