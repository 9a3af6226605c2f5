// The local rows of a sequence split by context parallelism (model/context_chunks.h): a rank's B*T
// rows are its two chunks of T/2 positions per sequence, chunk-major (the B sequences' rows of its first
// chunk, then of its second). for_each_context_chunk hands each chunk's rows to `f` with the chunk's length
// and the global position of its first token, for the ops that need positions (learned positions, rope).
#pragma once
#include <array>
#include <cstdint>

#include "model/context_chunks.h"
#include "model/tp_mappings.h"

namespace gpt {

// t [B*T, ...] of this rank's rows; f(Tensor& chunk_rows [B*T/2, ...], int64_t T/2, int64_t first_position).
template <class F>
void for_each_context_chunk(const LayerContext& ctx, Tensor& t, int64_t T, F f) {
  const int64_t c = T / 2, B = t.dim(0) / T;
  const std::array<int, 2> chunks = context_chunks(ctx.cp->size(), ctx.cp->rank());
  for (int k = 0; k < 2; ++k) {
    Tensor rows = t.rows(k * B * c, (k + 1) * B * c);
    f(rows, c, chunks[k] * c);
  }
}

}  // namespace gpt
