// Ring attention over the context-parallel group (model/ring_attention.h).
#include "model/ring_attention.h"

#include <array>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/context_chunks.h"

namespace gpt {

namespace {

constexpr int kForwardTag = 3501, kBackwardTag = 3502, kGradTag = 3503;

void check_shape(const Communicator& cp, const Tensor& qkv, const RingShape& s, const char* fn) {
  const int64_t rows = 2 * s.B * s.chunk, width = (s.H + 2 * s.G) * s.D;
  if (s.B < 1 || s.chunk < 1 || s.H < 1 || s.G < 1 || s.D < 1 || s.H % s.G != 0)
    throw std::invalid_argument(std::string(fn) + ": bad sizes B=" + std::to_string(s.B) + " chunk=" +
                                std::to_string(s.chunk) + " H=" + std::to_string(s.H) + " G=" + std::to_string(s.G) +
                                " D=" + std::to_string(s.D));
  if (qkv.ndim() != 2 || qkv.dim(0) != rows || qkv.dim(1) != width)
    throw std::invalid_argument(std::string(fn) + ": qkv " + shape_str(qkv.shape()) + " must be [2*B*chunk, (H+2G)*D] = [" +
                                std::to_string(rows) + ", " + std::to_string(width) + "] on context rank " +
                                std::to_string(cp.rank()) + " of " + std::to_string(cp.size()));
}

// This rank's keys and values: the last 2G*D columns of its qkv rows, [2*B*chunk, 2G*D].
Tensor own_keys_values(Backend& be, const Tensor& qkv, const RingShape& s) {
  Tensor kv = be.empty({qkv.dim(0), 2 * s.G * s.D}, qkv.dtype());
  be.copy_columns(qkv, s.H * s.D, kv, 0, 2 * s.G * s.D);
  return kv;
}

// Rows of one chunk (0 or 1) of a chunk-major [2*B*chunk, ...] tensor.
Tensor chunk_rows(const Tensor& t, int chunk, const RingShape& s) {
  const int64_t n = s.B * s.chunk;
  return t.rows(chunk * n, (chunk + 1) * n);
}

int next_rank(const Communicator& cp) { return (cp.rank() + 1) % cp.size(); }
int prev_rank(const Communicator& cp) { return (cp.rank() + cp.size() - 1) % cp.size(); }

}  // namespace

void ring_attention_forward(Backend& be, Communicator& cp, const Tensor& qkv, const RingShape& s, Tensor& att,
                            Tensor& lse) {
  check_shape(cp, qkv, s, "ring_attention_forward");
  const int P = cp.size(), r = cp.rank();
  const int64_t n = s.B * s.chunk, HD = s.H * s.D;
  att = be.empty({2 * n, HD}, qkv.dtype());
  lse = be.empty({2, s.B, s.H, s.chunk});
  // The running output and statistics of each query chunk; a chunk's first block writes them directly.
  std::array<Tensor, 2> out = {be.empty({n, HD}), be.empty({n, HD})};
  std::array<Tensor, 2> stats = {lse.slice_elems(0, {s.B, s.H, s.chunk}),
                                 lse.slice_elems(s.B * s.H * s.chunk, {s.B, s.H, s.chunk})};
  std::array<bool, 2> started = {false, false};
  Tensor block_out = be.empty({n, HD}), block_lse = be.empty({s.B, s.H, s.chunk});
  Tensor kv = own_keys_values(be, qkv, s), incoming = be.empty(kv.shape(), kv.dtype());
  for (int step = 0; step < P; ++step) {
    std::unique_ptr<PendingSend> exchange;
    if (step + 1 < P) exchange = cp.exchange_async(kv, next_rank(cp), incoming, prev_rank(cp), kForwardTag);
    for (const RingBlock& b : ring_blocks(P, r, step)) {
      const Tensor q = chunk_rows(qkv, b.q_chunk, s), k = chunk_rows(kv, b.kv_chunk, s);
      const int c = b.q_chunk;
      if (!started[c]) {
        be.attention_block_forward(q, k, s.B, s.chunk, s.chunk, s.H, s.G, s.D, b.causal, out[c], stats[c]);
        started[c] = true;
      } else {
        be.attention_block_forward(q, k, s.B, s.chunk, s.chunk, s.H, s.G, s.D, b.causal, block_out, block_lse);
        be.attention_merge(out[c], stats[c], block_out, block_lse, s.B, s.chunk, s.H, s.D);
      }
      if (exchange) exchange->progress();
    }
    if (exchange) {
      exchange->wait();
      std::swap(kv, incoming);
    }
  }
  for (int c = 0; c < 2; ++c) {
    Tensor dst = chunk_rows(att, c, s);
    be.copy_columns(out[c], 0, dst, 0, HD);
  }
}

void ring_attention_backward(Backend& be, Communicator& cp, const Tensor& datt, const Tensor& qkv, const Tensor& att,
                             const Tensor& lse, const RingShape& s, Tensor& dqkv) {
  check_shape(cp, qkv, s, "ring_attention_backward");
  const int P = cp.size(), r = cp.rank();
  const int64_t n = s.B * s.chunk, HD = s.H * s.D, KV = 2 * s.G * s.D;
  if (datt.numel() != 2 * n * HD || att.numel() != 2 * n * HD || lse.numel() != 2 * s.B * s.H * s.chunk ||
      dqkv.ndim() != 2 || dqkv.dim(0) != qkv.dim(0) || dqkv.dim(1) != qkv.dim(1))
    throw std::invalid_argument("ring_attention_backward: datt " + shape_str(datt.shape()) + ", att " +
                                shape_str(att.shape()) + ", lse " + shape_str(lse.shape()) + " or dqkv " +
                                shape_str(dqkv.shape()) + " does not match qkv " + shape_str(qkv.shape()));
  const Tensor att2 = att.view({2 * n, HD}), datt2 = datt.view({2 * n, HD});
  std::array<Tensor, 2> stats = {lse.slice_elems(0, {s.B, s.H, s.chunk}),
                                 lse.slice_elems(s.B * s.H * s.chunk, {s.B, s.H, s.chunk})};
  Tensor dq = be.empty({2 * n, HD});
  be.fill(dq, 0.f);
  Tensor kv = own_keys_values(be, qkv, s), incoming = be.empty(kv.shape(), kv.dtype());
  // dK/dV accumulators: `mine` takes this step's share, `arrived` the partial sum from the previous rank,
  // `leaving` the sum sent on at the previous step (free again once that exchange completes).
  Tensor mine = be.empty({2 * n, KV}), arrived = be.empty({2 * n, KV}), leaving = be.empty({2 * n, KV});
  std::unique_ptr<PendingSend> grads;  // the dK/dV hop started at the end of the previous step
  for (int step = 0; step < P; ++step) {
    std::unique_ptr<PendingSend> exchange;
    if (step + 1 < P) exchange = cp.exchange_async(kv, next_rank(cp), incoming, prev_rank(cp), kBackwardTag);
    be.fill(mine, 0.f);
    for (const RingBlock& b : ring_blocks(P, r, step)) {
      const int c = b.q_chunk;
      const Tensor q = chunk_rows(qkv, c, s), k = chunk_rows(kv, b.kv_chunk, s);
      Tensor dq_c = chunk_rows(dq, c, s), dkv_c = chunk_rows(mine, b.kv_chunk, s);
      be.attention_block_backward(chunk_rows(datt2, c, s), q, k, chunk_rows(att2, c, s), stats[c], s.B, s.chunk,
                                  s.chunk, s.H, s.G, s.D, b.causal, dq_c, dkv_c);
      if (exchange) exchange->progress();
      if (grads) grads->progress();
    }
    if (grads) {  // the previous ranks' partial sum for this step's block
      grads->wait();
      be.accumulate(arrived, mine);
    }
    if (exchange) {
      exchange->wait();
      std::swap(kv, incoming);
    }
    // Pass the block's sum on; after the last step it is complete and goes to its owner (the next rank),
    // while this rank's own complete sum arrives from the previous one.
    std::swap(mine, leaving);  // leaving = this step's sum; mine = the buffer sent a step ago (free below)
    grads = cp.exchange_async(leaving, next_rank(cp), arrived, prev_rank(cp), kGradTag);
  }
  grads->wait();
  be.copy_columns(arrived, 0, dqkv, HD, KV);
  be.copy_columns(dq, 0, dqkv, 0, HD);
}

}  // namespace gpt
