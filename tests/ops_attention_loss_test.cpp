// Tests of the CPU backend's attention, cross-entropy and optimizer kernels (model/ops/backend.h): the
// fused attention against a double reference and finite differences (small shapes) or directional
// derivatives (large ones), the vocab-parallel cross-entropy stages against a reference and finite
// differences of the loss, AdamW against a double reference, and the exact sum of squares.
#include "tests/ops_test_util.h"

namespace gpt {
namespace {

// A suite of its own: OpsTest (ops_test_util.h) is file-local, one class per file.
class OpsAttentionLossTest : public OpsTest {};

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

TEST_F(OpsAttentionLossTest, AttentionForwardMatchesReference) {
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

TEST_F(OpsAttentionLossTest, AttentionBackwardMatchesFiniteDifferences) {
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

TEST_F(OpsAttentionLossTest, AttentionBackwardLargeMatchesDirectionalDerivative) {
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

TEST_F(OpsAttentionLossTest, CrossEntropyShardedPipelineMatchesReferenceAndFiniteDifferences) {
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

TEST_F(OpsAttentionLossTest, CrossEntropyShardWithOnlyPadding) {
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

TEST_F(OpsAttentionLossTest, CrossEntropyLargeVocabMatchesReference) {
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

// The one-read statistics: on a whole row the same values as the two stages; split over 3 vocab shards
// (the last holding only padding) and brought to the common max by ce_rescale_sum_exp, the shards' sums
// add up to the whole row's sum of exponentials in double.
TEST_F(OpsAttentionLossTest, CrossEntropyRowStatsInOneReadMatchTheTwoStages) {
  const int64_t N = 5, vocab = 1000, shard = 512;  // shards [0, 512), [512, 1024) (24 padding), [1024, 1536)
  Vec logits = randn(N * shard * 3, 4.f);
  std::vector<int32_t> targets = {0, 999, 511, 512, 77};
  Tensor tt = make_ids({N}, targets);
  double sums[N] = {}, maxes[N];
  std::fill(maxes, maxes + N, -1e300);
  std::vector<Vec> parts(3);
  for (int k = 0; k < 3; ++k) {
    parts[k].resize(N * shard);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < shard; ++c) parts[k][n * shard + c] = logits[(n * 3 + k) * shard + c];
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < shard && k * shard + c < vocab; ++c) maxes[n] = std::max(maxes[n], double(parts[k][n * shard + c]));
  }
  for (int k = 0; k < 3; ++k)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < shard && k * shard + c < vocab; ++c) sums[n] += std::exp(parts[k][n * shard + c] - maxes[n]);
  Tensor gmax = make({N}, Vec(maxes, maxes + N)), total = make({N}, Vec(N, 0.f));
  Vec sum_of_shards(N, 0.f);
  for (int k = 0; k < 3; ++k) {
    Tensor tl = make({N, shard}, parts[k]), mx = be->empty({N}), se = be->empty({N}), tg = be->empty({N});
    be->ce_row_stats(tl, tt, k * shard, vocab, mx, se, tg);
    Tensor mx2 = be->empty({N}), se2 = be->empty({N}), tg2 = be->empty({N});
    be->ce_row_max(tl, k * shard, vocab, mx2);
    be->ce_sum_exp(tl, mx2, tt, k * shard, vocab, se2, tg2);
    EXPECT_EQ(host(mx), host(mx2)) << "shard " << k;
    EXPECT_EQ(host(se), host(se2)) << "shard " << k;
    EXPECT_EQ(host(tg), host(tg2)) << "shard " << k;
    be->ce_rescale_sum_exp(mx, gmax, se);
    const Vec v = host(se);
    for (int64_t n = 0; n < N; ++n) sum_of_shards[n] += v[n];
    if (k == 2) {
      for (float x : v) EXPECT_EQ(x, 0.f);  // only padding: nothing, not NaN
    }
  }
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(sum_of_shards[n], sums[n], 1e-5 * sums[n]) << "row " << n;
}

TEST_F(OpsAttentionLossTest, CrossEntropyRejectsTargetsOutsideVocabulary) {
  Tensor tl = make({2, 4}, randn(8)), mx = make({2}, {0.f, 0.f}), se = be->empty({2}), tgt = be->empty({2});
  Tensor tt = make_ids({2}, {1, 4});  // 4 is padding of a vocabulary of 4
  EXPECT_THROW(be->ce_sum_exp(tl, mx, tt, 0, 4, se, tgt), std::runtime_error);
  Tensor neg = make_ids({2}, {-1, 0});
  EXPECT_THROW(be->ce_sum_exp(tl, mx, neg, 0, 4, se, tgt), std::runtime_error);
}

// ---------------------------------------------------------------------------------------------------
// Optimizer

TEST_F(OpsAttentionLossTest, AdamWMatchesDoubleReference) {
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

TEST_F(OpsAttentionLossTest, SumSquaresIsExactInDouble) {
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

}  // namespace
}  // namespace gpt
