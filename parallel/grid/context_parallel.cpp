// Context parallelism's printouts (parallel/grid/context_parallel.h): the chunk picture and the ring schedule
// table, built from the chunk arithmetic in model/context_chunks.h.
#include "parallel/grid/context_parallel.h"

#include <stdexcept>

#include "model/context_chunks.h"

namespace gpt {

std::string context_chunk_picture(int size) {
  if (size < 1) throw std::invalid_argument("context_chunk_picture: the context group needs a rank");
  std::string s = "sequence of " + std::to_string(2 * size) + " chunks: |";
  for (int c = 0; c < 2 * size; ++c) {
    const int owner = c < size ? c : 2 * size - 1 - c;
    s += " c" + std::to_string(c) + " r" + std::to_string(owner) + " |";
  }
  return s;
}

std::string format_ring_schedule(int size) {
  std::string out = "context parallel " + std::to_string(size) + ", " + context_chunk_picture(size) + "\n" +
                    "ring attention: at step i rank r holds the keys and values of rank (r - i) mod " +
                    std::to_string(size) + "; fully masked chunk pairs are skipped\n";
  const auto chunks_str = [&](int rank) {
    const std::array<int, 2> c = context_chunks(size, rank);
    return "chunks " + std::to_string(c[0]) + ", " + std::to_string(c[1]);
  };
  for (int r = 0; r < size; ++r) {
    out += "rank " + std::to_string(r) + " (" + chunks_str(r) + "):\n";
    const std::array<int, 2> q = context_chunks(size, r);
    for (int step = 0; step < size; ++step) {
      const int source = ring_source(size, r, step);
      const std::array<int, 2> kv = context_chunks(size, source);
      out += "  step " + std::to_string(step) + " from rank " + std::to_string(source) + " (" + chunks_str(source) +
             "):";
      bool first = true;
      for (const RingBlock& b : ring_blocks(size, r, step)) {
        out += std::string(first ? " " : ", ") + "q" + std::to_string(q[b.q_chunk]) + ".k" +
               std::to_string(kv[b.kv_chunk]) + (b.causal ? " causal" : " full");
        first = false;
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace gpt
