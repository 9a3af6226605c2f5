// The overlapped all-gather and reduce-scatter of the tensor-parallel region (see tp_overlap.h).
#include "model/tp_overlap.h"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

namespace {
// Tags of the overlap's messages on the tp group (which carries no other point-to-point traffic); one
// per ring step, so a late message of one step can never be taken for another's.
constexpr int kGatherTag = 7100;
constexpr int kScatterTag = 7200;

std::atomic<int64_t> row_blocks{0};

int64_t block_rows(const LayerContext& ctx, int64_t rows_full, const char* what) {
  const int tp = ctx.tp.size();
  if (rows_full % tp != 0)
    throw std::invalid_argument(std::string("tensor-parallel overlap (") + what + "): " + std::to_string(rows_full) +
                                " rows do not split over tensor-parallel size " + std::to_string(tp));
  return rows_full / tp;
}
}  // namespace

int64_t tp_overlap_row_blocks() { return row_blocks.load(); }

bool tp_overlap_applies(const LayerContext& ctx) {
  return ctx.tp_comm_overlap && ctx.sequence_parallel && ctx.tp.size() > 1;
}

Tensor gather_rows_overlapped(LayerContext& ctx, const Tensor& shard, const RowBlockOp& op) {
  const int tp = ctx.tp.size(), r = ctx.tp.rank();
  const int64_t n = shard.dim(0);
  Tensor full = ctx.backend.empty({n * tp, shard.dim(1)}, shard.dtype());
  Tensor own = full.rows(r * n, (r + 1) * n);
  ctx.backend.copy(shard, own);
  // Step s: this rank holds block (r - s) mod tp; it sends it on to r + 1 and receives block
  // (r - s - 1) mod tp from r - 1, and runs op on the block it holds while the exchange is in flight.
  const int next = (r + 1) % tp, prev = (r + tp - 1) % tp;
  for (int s = 0; s < tp; ++s) {
    const int held = (r - s + tp) % tp, incoming = (r - s - 1 + 2 * tp) % tp;
    std::unique_ptr<PendingSend> exchange;
    Tensor in;
    if (s + 1 < tp) {
      in = full.rows(incoming * n, (incoming + 1) * n);
      exchange = ctx.tp.exchange_async(full.rows(held * n, (held + 1) * n), next, in, prev, kGatherTag + s);
    }
    op(held * n, (held + 1) * n, full.rows(held * n, (held + 1) * n));
    if (exchange) exchange->wait();
  }
  row_blocks += tp;
  return full;
}

Tensor reduce_scatter_rows_overlapped(LayerContext& ctx, int64_t rows_full, int64_t cols, DType dtype,
                                      const RowBlockProducer& produce, const std::function<void()>& meanwhile) {
  Backend& be = ctx.backend;
  const int tp = ctx.tp.size(), r = ctx.tp.rank();
  const int64_t n = block_rows(ctx, rows_full, "reduce-scatter");
  // parts[j]: rank j's partial sums of this rank's block. Step s sends block (r + s) mod tp to its owner
  // and receives rank (r - s) mod tp's partial of block r; this rank's own partial is computed last, while
  // the others' are in flight.
  std::vector<Tensor> parts(static_cast<size_t>(tp)), outgoing(static_cast<size_t>(tp));
  std::vector<std::unique_ptr<PendingSend>> exchanges;
  for (int s = 1; s < tp; ++s) {
    const int to = (r + s) % tp, from = (r - s + tp) % tp;
    outgoing[s] = be.empty({n, cols}, dtype);
    produce(to * n, (to + 1) * n, outgoing[s]);
    parts[from] = be.empty({n, cols}, dtype);
    exchanges.push_back(ctx.tp.exchange_async(outgoing[s], to, parts[from], from, kScatterTag + s));
  }
  parts[r] = be.empty({n, cols}, dtype);
  produce(r * n, (r + 1) * n, parts[r]);
  if (meanwhile) meanwhile();
  for (auto& e : exchanges) e->wait();
  row_blocks += tp;
  // The rank-order sum in fp32, rounded once into a 16-bit result.
  Tensor sum = be.empty({n, cols}, DType::F32);
  be.copy(parts[0], sum);
  for (int j = 1; j < tp; ++j) be.accumulate(parts[j], sum);
  if (dtype == DType::F32) return sum;
  Tensor out = be.empty({n, cols}, dtype);
  be.copy(sum, out);
  return out;
}

}  // namespace gpt
