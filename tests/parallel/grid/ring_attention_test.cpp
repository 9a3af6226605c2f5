// Ring attention against full causal attention in double precision, on a context group of 4 ranks: one
// sequence of T = 4096 positions, 4 query heads sharing 2 key/value groups, head dim 16. Every rank builds
// the whole sequence's qkv and output gradient from the same seed, takes its two chunks (r and 7 - r of
// 8), runs the ring forward and backward on the CPU backend in fp32, and compares its rows of the output,
// the log-sum-exp and dQ, dK, dV with an fp64 evaluation of the textbook formulas over the whole sequence:
//   S = Q K^T / sqrt(D) (causal), P = softmax(S), O = P V, lse = log sum exp S;
//   dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "model/context_chunks.h"
#include "model/ring_attention.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/grid/process_grid.h"

using namespace gpt;

namespace {

constexpr int64_t T = 4096, H = 4, G = 2, D = 16, W = (H + 2 * G) * D, HD = H * D;

struct Reference {
  std::vector<double> out, lse, dqkv;  // out [T, HD], lse [H, T], dqkv [T, W]
};

// The fp64 causal attention and its gradient, head by head.
Reference reference(const std::vector<float>& qkv, const std::vector<float>& dout) {
  Reference r;
  r.out.assign(T * HD, 0.0);
  r.lse.assign(H * T, 0.0);
  r.dqkv.assign(T * W, 0.0);
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> p(T), dp(T);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / G), qc = h * D, kc = HD + g * D, vc = HD + (G + g) * D;
    for (int64_t i = 0; i < T; ++i) {
      double m = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += double(qkv[i * W + qc + d]) * qkv[j * W + kc + d];
        p[j] = s * scale;
        m = std::max(m, p[j]);
      }
      double l = 0;
      for (int64_t j = 0; j <= i; ++j) l += std::exp(p[j] - m);
      r.lse[h * T + i] = m + std::log(l);
      for (int64_t j = 0; j <= i; ++j) {
        p[j] = std::exp(p[j] - r.lse[h * T + i]);
        for (int64_t d = 0; d < D; ++d) r.out[i * HD + qc + d] += p[j] * qkv[j * W + vc + d];
      }
      double dv_row = 0;
      for (int64_t d = 0; d < D; ++d) dv_row += double(dout[i * HD + qc + d]) * r.out[i * HD + qc + d];
      for (int64_t j = 0; j <= i; ++j) {
        double dpj = 0;
        for (int64_t d = 0; d < D; ++d) {
          dpj += double(dout[i * HD + qc + d]) * qkv[j * W + vc + d];
          r.dqkv[j * W + vc + d] += p[j] * dout[i * HD + qc + d];  // dV
        }
        const double ds = p[j] * (dpj - dv_row) * scale;
        for (int64_t d = 0; d < D; ++d) {
          r.dqkv[i * W + qc + d] += ds * qkv[j * W + kc + d];  // dQ
          r.dqkv[j * W + kc + d] += ds * qkv[i * W + qc + d];  // dK
        }
      }
    }
  }
  return r;
}

// The global rows of this rank's local rows, in order (B = 1: chunk 0's positions, then chunk 1's).
std::vector<int64_t> local_positions(int size, int rank) {
  const int64_t c = T / (2 * size);
  std::vector<int64_t> pos;
  for (int chunk : context_chunks(size, rank))
    for (int64_t t = 0; t < c; ++t) pos.push_back(chunk * c + t);
  return pos;
}

// Relative l2 distance between columns [col, col + width) of local rows and the reference's global rows.
double distance(const std::vector<float>& local, int64_t ld, const std::vector<double>& ref, int64_t ref_ld,
                const std::vector<int64_t>& pos, int64_t col, int64_t width) {
  double num = 0, den = 0;
  for (size_t r = 0; r < pos.size(); ++r)
    for (int64_t c = col; c < col + width; ++c) {
      const double e = local[r * ld + c] - ref[pos[r] * ref_ld + c];
      num += e * e;
      den += ref[pos[r] * ref_ld + c] * ref[pos[r] * ref_ld + c];
    }
  return std::sqrt(num / den);
}

}  // namespace

TEST(RingAttention, MatchesFullAttentionInDoubleAtT4096Context4) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 4) << "run on 4 ranks";
  ParallelState ps = mpi_parallel_state(GridLayout(4, 1, 1, 1, 4));
  Communicator& cp = *ps.cp;
  ASSERT_EQ(cp.size(), 4);

  std::mt19937 gen(35);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> qkv(T * W), dout(T * HD);
  for (float& x : qkv) x = 2.f * u(gen);  // scores of a few units: peaked and flat softmax rows alike
  for (float& x : dout) x = u(gen);
  const Reference ref = reference(qkv, dout);

  const std::vector<int64_t> pos = local_positions(cp.size(), cp.rank());
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<float> local_qkv(n * W), local_dout(n * HD);
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(&qkv[pos[r] * W], W, &local_qkv[r * W]);
    std::copy_n(&dout[pos[r] * HD], HD, &local_dout[r * HD]);
  }
  auto be = make_backend("cpu");
  Tensor q = be->empty({n, W}), dO = be->empty({n, HD});
  be->upload(local_qkv.data(), q);
  be->upload(local_dout.data(), dO);
  const RingShape shape{1, T / (2 * cp.size()), H, G, D};
  Tensor att, lse;
  ring_attention_forward(*be, cp, q, shape, att, lse);
  Tensor dqkv = be->empty({n, W});
  ring_attention_backward(*be, cp, dO, q, att, lse, shape, dqkv);

  std::vector<float> out(n * HD), stats(2 * H * shape.chunk), grad(n * W);
  be->download(att, out.data());
  be->download(lse, stats.data());
  be->download(dqkv, grad.data());
  // fp32 products of 16 terms and a fast exp: a few 1e-7 relative, far below what any masking or merge
  // error (a whole block's share of a softmax row) would give.
  const double e_out = distance(out, HD, ref.out, HD, pos, 0, HD), e_dq = distance(grad, W, ref.dqkv, W, pos, 0, HD);
  const double e_dk = distance(grad, W, ref.dqkv, W, pos, HD, G * D);
  const double e_dv = distance(grad, W, ref.dqkv, W, pos, HD + G * D, G * D);
  std::printf("context rank %d: relative l2 distance to fp64: out %.2e dQ %.2e dK %.2e dV %.2e\n", cp.rank(), e_out,
              e_dq, e_dk, e_dv);
  EXPECT_LE(e_out, 1e-5) << "output, context rank " << cp.rank();
  EXPECT_LE(e_dq, 1e-5) << "dQ, context rank " << cp.rank();
  EXPECT_LE(e_dk, 1e-5) << "dK, context rank " << cp.rank();
  EXPECT_LE(e_dv, 1e-5) << "dV, context rank " << cp.rank();
  double worst = 0;
  for (int k = 0; k < 2; ++k)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < shape.chunk; ++t)
        worst = std::max(worst, std::abs(stats[(k * H + h) * shape.chunk + t] -
                                         ref.lse[h * T + pos[k * shape.chunk + t]]));
  EXPECT_LE(worst, 1e-5) << "log-sum-exp, context rank " << cp.rank();
}

TEST(RingAttention, ScheduleCoversEveryUnmaskedPairOnceWithEqualWork) {
  for (int P : {1, 2, 3, 4, 8})
    for (int r = 0; r < P; ++r) {
      std::vector<int> seen(4 * P * P, 0);
      for (int step = 0; step < P; ++step) {
        const auto q = context_chunks(P, r), kv = context_chunks(P, ring_source(P, r, step));
        double work = 0;
        for (const RingBlock& b : ring_blocks(P, r, step)) {
          const int qc = q[b.q_chunk], kc = kv[b.kv_chunk];
          EXPECT_LE(kc, qc);
          EXPECT_EQ(b.causal, kc == qc);
          ++seen[qc * 2 * P + kc];
          work += b.causal ? 0.5 : 1.0;
        }
        EXPECT_EQ(work, 2.0) << "P=" << P << " r=" << r << " step " << step;  // two full blocks' work
      }
      for (int qc : context_chunks(P, r))
        for (int kc = 0; kc < 2 * P; ++kc) EXPECT_EQ(seen[qc * 2 * P + kc], kc <= qc ? 1 : 0);
    }
}
