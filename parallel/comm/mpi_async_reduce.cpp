// The MPI communicator's non-blocking reductions of fp32 host tensors (gradient buckets). Those of
// kRingMinBytes and more run as the communicator's own rings (parallel/comm/mpi_ring.cpp); below that, sums
// run as MPI_Iallreduce in place, and reduce-scatters as MPI_Ireduce_scatter with one count per rank into
// a receive buffer that is copied into this rank's block when the reduction completes. Both are cut into the same pieces as the blocking
// collectives (MpiCommunicator::kReduceChunkElems), each piece its own request; the handle keeps the
// tensor, the counts and the receive buffer alive until every request is done. Open MPI runs a
// non-blocking collective's rounds only inside MPI calls, so progress() tests the requests: the bucket
// reducer calls it as later buckets start.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "parallel/comm/mpi_communicator.h"

namespace gpt {

namespace {
// The blocking reductions' piece size: the same pieces keep Open MPI on its fast shared-memory path.
constexpr int64_t kPieceElems = MpiCommunicator::kReduceChunkElems;

MPI_Op mpi_sum_or(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    default: return MPI_SUM;
  }
}
}  // namespace

class MpiCommunicator::PendingReduction final : public PendingSend {
 public:
  PendingReduction(MpiCommunicator& comm, Tensor t) : comm_(comm), tensor_(std::move(t)) {}
  ~PendingReduction() override {
    try {
      wait();
    } catch (const std::exception& e) {
      spdlog::error("MPI reduction completed with an error while being destroyed: {}", e.what());
    }
  }

  void progress() override {
    if (requests_.empty()) return;
    int done = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) finish(MPI_SUCCESS);
  }

  void wait() override {
    if (requests_.empty()) return;
    const auto start = std::chrono::steady_clock::now();
    int rc = MPI_SUCCESS;
    {
      CommunicationMarker marker(comm_.name_);
      rc = MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    }
    comm_.seconds_spent_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    finish(rc);
  }

  std::vector<MPI_Request> requests_;
  std::vector<std::vector<int>> counts_;  // per piece of a reduce-scatter; MPI reads them until completion
  std::vector<float> received_;           // this rank's block, as it arrives
  float* block_ = nullptr;                // where received_ goes once complete

 private:
  void finish(int rc) {
    requests_.clear();
    if (block_ && rc == MPI_SUCCESS) std::memcpy(block_, received_.data(), received_.size() * sizeof(float));
    block_ = nullptr;
    tensor_ = Tensor();
    comm_.check(rc, "non-blocking reduction (MPI_Waitall)");
  }

  MpiCommunicator& comm_;
  Tensor tensor_;
};

std::unique_ptr<PendingSend> MpiCommunicator::all_reduce_async(Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce_async");
  if (t.dtype() != DType::F32) return Communicator::all_reduce_async(t, op);  // 16-bit: the blocking path
  if (op == ReduceOp::Sum && size_ > 1 && t.numel() * int64_t(sizeof(float)) >= kRingMinBytes) return start_ring_all_reduce(t);
  auto pending = std::make_unique<PendingReduction>(*this, t);
  for (int64_t start = 0; start < t.numel(); start += kPieceElems) {
    const int n = static_cast<int>(std::min(kPieceElems, t.numel() - start));
    pending->requests_.emplace_back(MPI_REQUEST_NULL);
    check(MPI_Iallreduce(MPI_IN_PLACE, t.f32() + start, n, MPI_FLOAT, mpi_sum_or(op), comm_,
                         &pending->requests_.back()),
          "MPI_Iallreduce");
  }
  bytes_moved_ += t.numel() * static_cast<int64_t>(sizeof(float));
  return pending;
}

std::unique_ptr<PendingSend> MpiCommunicator::reduce_scatter_blocks_async(Tensor& t,
                                                                         const std::vector<int64_t>& counts) {
  check_tensor(t, "reduce_scatter_blocks_async");
  check_block_counts(counts, t.numel(), "MpiCommunicator(" + name_ + ")");
  if (t.dtype() != DType::F32) return Communicator::reduce_scatter_blocks_async(t, counts);
  if (size_ > 1 && t.numel() * int64_t(sizeof(float)) >= kRingMinBytes) return start_ring_reduce_scatter(t, counts);
  auto pending = std::make_unique<PendingReduction>(*this, t);
  // Block r is [begin[r], begin[r] + counts[r]) of t.
  std::vector<int64_t> begin(size_, 0);
  for (int r = 1; r < size_; ++r) begin[r] = begin[r - 1] + counts[r - 1];
  pending->received_.resize(static_cast<size_t>(counts[rank_]));
  pending->block_ = t.f32() + begin[rank_];
  const int64_t pieces = (t.numel() + kPieceElems - 1) / kPieceElems;
  pending->counts_.reserve(static_cast<size_t>(pieces));
  // Piece [lo, hi) of t holds consecutive parts of the blocks it crosses; this rank's part lands next in
  // received_ (the pieces walk t in order).
  int64_t received = 0;
  for (int64_t lo = 0; lo < t.numel(); lo += kPieceElems) {
    const int64_t hi = std::min(t.numel(), lo + kPieceElems);
    std::vector<int>& piece_counts = pending->counts_.emplace_back(size_, 0);
    for (int r = 0; r < size_; ++r)
      piece_counts[r] = static_cast<int>(std::max<int64_t>(0, std::min(hi, begin[r] + counts[r]) - std::max(lo, begin[r])));
    pending->requests_.emplace_back(MPI_REQUEST_NULL);
    check(MPI_Ireduce_scatter(t.f32() + lo, pending->received_.data() + received, piece_counts.data(), MPI_FLOAT,
                              MPI_SUM, comm_, &pending->requests_.back()),
          "MPI_Ireduce_scatter");
    received += piece_counts[rank_];
  }
  bytes_moved_ += t.numel() * static_cast<int64_t>(sizeof(float));
  return pending;
}

}  // namespace gpt
