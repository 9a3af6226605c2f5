// Context parallelism's printouts: the chunk assignment as a picture (the grid printout, the docs) and every
// rank's ring attention steps as a table (`gpt-train schedule --cp N`). The arithmetic they print, which
// chunks a rank holds and which blocks each ring step runs, is model/context_chunks.h.
#pragma once
#include <string>

namespace gpt {

// A picture of the chunk assignment for the grid printout, `schedule` and the docs, e.g. for CP = 2:
//   sequence of 4 chunks: | c0 r0 | c1 r1 | c2 r1 | c3 r0 |
std::string context_chunk_picture(int size);

// The picture and every rank's ring steps as a table (`gpt-train schedule --cp N`): at each step the rank
// it holds keys and values from and the blocks it runs, e.g. "q3.k0 full" (query chunk 3 against key chunk
// 0) or "q0.k0 causal".
std::string format_ring_schedule(int size);

}  // namespace gpt
