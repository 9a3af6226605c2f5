// Context parallelism's pure arithmetic: which chunks of a sequence a rank holds, and the ring attention
// schedule (which query chunk meets which key/value chunk at each ring step, and with what mask). The
// sequence of T positions is cut into 2*CP chunks of T/(2*CP); rank r of the context group holds chunks
// r and 2*CP-1-r (Megatron-Core's load balancing for causal masks: every rank gets one early and one late
// chunk, so all do the same attention work), stored chunk-major: the B sequences' rows of its first chunk,
// then those of its second. At ring step i a rank holds the keys and values of rank (r - i) mod CP's two
// chunks; chunk pairs whose keys all lie after the queries are fully masked and skipped. The ring
// attention (model/ring_attention.cpp) and the batch loader use it; parallel/grid/context_parallel.h prints it.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

// The two global chunk indices rank `rank` of a context group of `size` holds, in its local row order.
std::array<int, 2> context_chunks(int size, int rank);

// The rank whose keys and values this rank holds at ring step `step` (0 = its own).
int ring_source(int size, int rank, int step);

// One attention block of a ring step: the local query chunk (0 or 1) against the key/value chunk (0 or
// 1) of the block received at that step; causal when both are the same chunk (the diagonal), else every
// query sees every key.
struct RingBlock {
  int q_chunk = 0, kv_chunk = 0;
  bool causal = false;
  bool operator==(const RingBlock& o) const {
    return q_chunk == o.q_chunk && kv_chunk == o.kv_chunk && causal == o.causal;
  }
};

// The unmasked blocks of ring step `step` for rank `rank` (in the order they run). Step 0: two causal
// diagonals and the late chunk against the early one; a step bringing an earlier rank's chunks: both local
// chunks against its early chunk; a later rank's: the late local chunk against both of its chunks. Each
// step is two full blocks' work.
std::vector<RingBlock> ring_blocks(int size, int rank, int step);

}  // namespace gpt
