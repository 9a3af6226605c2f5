// Context parallelism's chunk assignment and ring attention schedule (model/context_chunks.h).
#include "model/context_chunks.h"

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

}  // namespace gpt
