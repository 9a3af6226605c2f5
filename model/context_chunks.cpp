// Context parallelism's chunk assignment and ring attention schedule (parallel/grid/context_parallel.h).
#include "parallel/grid/context_parallel.h"

#include <stdexcept>

namespace gpt {

namespace {
void check_rank(int size, int rank, const char* fn) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument(std::string(fn) + ": rank " + std::to_string(rank) + " is outside a context group of " +
                                std::to_string(size));
}
}  // namespace

std::array<int, 2> context_chunks(int size, int rank) {
  check_rank(size, rank, "context_chunks");
  return {rank, 2 * size - 1 - rank};
}

int ring_source(int size, int rank, int step) {
  check_rank(size, rank, "ring_source");
  if (step < 0 || step >= size)
    throw std::invalid_argument("ring_source: step " + std::to_string(step) + " is outside a ring of " +
                                std::to_string(size));
  return ((rank - step) % size + size) % size;
}

std::vector<RingBlock> ring_blocks(int size, int rank, int step) {
  const int source = ring_source(size, rank, step);
  const std::array<int, 2> q = context_chunks(size, rank), kv = context_chunks(size, source);
  std::vector<RingBlock> blocks;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      if (kv[j] > q[i]) continue;  // every key after every query: fully masked
      blocks.push_back({i, j, kv[j] == q[i]});
    }
  return blocks;
}

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
