// Tensor-parallel communication overlapped with the GEMMs beside it (parallel.tp_comm_overlap, Megatron's
// --tp-comm-overlap), under sequence parallelism: a [rows_full, C] activation is tp row blocks, block k
// held by tp rank k outside the tensor-parallel region.
//  - gather_rows_overlapped: the all-gather before a column-parallel GEMM as a ring of tp - 1 exchanges.
//    While block k travels on to the next rank, `op` runs on it (the GEMM rows of that block), so every
//    exchange but the first hides behind a block's GEMM.
//  - reduce_scatter_rows_overlapped: the reduce-scatter after a row-parallel GEMM. `produce` computes
//    the partial sums of one row block at a time, each sent to its owner as soon as it is ready while the
//    next is computed; `meanwhile` (the weight-gradient GEMM in backward) runs before the last wait. The
//    owner adds the tp partials in fp32 in rank order, each sum rounded once: the order
//    MpiCommunicator::reduce_scatter uses, so on the CPU the overlapped and the plain region give the same
//    bits when the GEMMs do (each output row of a oneDNN product depends on its own input row only).
// Transfers go through Communicator::exchange_async: non-blocking MPI on the CPU, NCCL on the
// communicator's per-peer streams beside the compute stream on CUDA. With the option off, without
// sequence parallelism or with a group of one, callers take the plain mappings of model/tp_mappings.h.
#pragma once
#include <cstdint>
#include <functional>

#include "model/tp_mappings.h"

namespace gpt {

// Whether the region's collectives run overlapped here: the option on, sequence parallelism, tp > 1.
bool tp_overlap_applies(const LayerContext& ctx);

// Computes rows [row_begin, row_end) of an output from `rows`, the same rows of the gathered input.
using RowBlockOp = std::function<void(int64_t row_begin, int64_t row_end, const Tensor& rows)>;
// Writes rows [row_begin, row_end) of a full-row partial-sum tensor into `block` ([row_end - row_begin, C]).
using RowBlockProducer = std::function<void(int64_t row_begin, int64_t row_end, Tensor& block)>;

// Returns [tp * shard rows, C] holding every rank's shard (rank k's at row block k, as all_gather); op
// runs once on each row block, in the order the blocks arrive (this rank's own first).
Tensor gather_rows_overlapped(LayerContext& ctx, const Tensor& shard, const RowBlockOp& op);

// Returns this rank's row block [rows_full / tp, cols] (dtype) of the group's sum of the full partial
// tensors that `produce` defines block by block.
Tensor reduce_scatter_rows_overlapped(LayerContext& ctx, int64_t rows_full, int64_t cols, DType dtype,
                                      const RowBlockProducer& produce, const std::function<void()>& meanwhile = {});

// Row blocks that went through either function in this process so far (logs; the tests check that the
// overlapped path ran).
int64_t tp_overlap_row_blocks();

}  // namespace gpt
