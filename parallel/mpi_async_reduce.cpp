// The MPI communicator's non-blocking reductions of fp32 host tensors (gradient buckets): a ring
// all-reduce of our own for sums of kRingMinBytes and more (PendingRing), MPI_Iallreduce in place below
// that, and MPI_Ireduce_scatter with one count per rank into a receive buffer that is copied into this
// rank's block when the reduction completes. Both are cut into the same pieces as the blocking
// collectives (MpiCommunicator::kReduceChunkElems), each piece its own request; the handle keeps the
// tensor, the counts and the receive buffer alive until every request is done. Open MPI runs a
// non-blocking collective's rounds only inside MPI calls, so progress() tests the requests: the bucket
// reducer calls it as later buckets start.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "parallel/mpi_communicator.h"

namespace gpt {

namespace {
// The blocking reductions' piece size: the same pieces keep Open MPI on its fast shared-memory path.
constexpr int64_t kPieceElems = MpiCommunicator::kReduceChunkElems;
// The ring's pieces: each ring in flight holds a receive buffer of one piece, and a step's buckets can all
// be in flight at once, so the pieces stay small (two ranks: 3.4-3.9 GB/s at 1 MiB, as at 8 MiB).
constexpr int64_t kRingPieceElems = MpiCommunicator::kRingMinBytes / 4;

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

// Ring all-reduce as a state machine: 2(p - 1) steps (p - 1 of reduce-scatter, then p - 1 of
// all-gather), each sending one block to the right neighbour while receiving one from the left, in pieces
// of at most kRingPieceElems; a reduce-scatter piece lands in scratch and is added into the tensor, an
// all-gather piece lands in place. One piece is in flight at a time; progress() moves on as far as the
// arrived pieces allow without blocking, wait() to the end. Each block's sum is formed once, on the rank
// the ring ends at, and then copied, so every rank gets the same bits, in an order of additions fixed by
// the group's size.
class MpiCommunicator::PendingRing final : public PendingSend {
 public:
  PendingRing(MpiCommunicator& comm, Tensor t)
      : comm_(comm), tensor_(std::move(t)), n_(tensor_.numel()), p_(comm.size_),
        block_((n_ + p_ - 1) / p_),
        tag_(comm.tag_ub_ + 1 + static_cast<int>(comm.rings_started_++ % kRingTags)) {
    if (!comm_.ring_scratch_.empty()) {
      scratch_ = std::move(comm_.ring_scratch_.back());
      comm_.ring_scratch_.pop_back();
    }
    scratch_.resize(static_cast<size_t>(std::min(block_, kRingPieceElems)));
    post();
  }
  ~PendingRing() override {
    try {
      wait();
    } catch (const std::exception& e) {
      spdlog::error("MPI ring all-reduce completed with an error while being destroyed: {}", e.what());
    }
  }

  void progress() override {
    while (in_flight()) {
      int done = 0;
      comm_.check(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE), "ring all-reduce (MPI_Testall)");
      if (!done) return;
      arrived();
    }
  }

  void wait() override {
    if (!in_flight()) return;
    const auto start = std::chrono::steady_clock::now();
    {
      CommunicationMarker marker(comm_.name_);
      while (in_flight()) {
        comm_.check(MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE), "ring all-reduce (MPI_Waitall)");
        arrived();
      }
    }
    comm_.seconds_spent_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  bool in_flight() const { return step_ < 2 * (p_ - 1); }
  bool reducing() const { return step_ < p_ - 1; }
  std::pair<int64_t, int64_t> block_range(int b) const {
    const int64_t begin = std::min(n_, int64_t(b) * block_);
    return {begin, std::min(n_, begin + block_)};
  }
  // After reduce-scatter step k rank r holds the partial sum of block (r - k - 1) mod p over k + 2 ranks,
  // so after p - 1 steps its block (r + 1) mod p is complete; the all-gather passes complete blocks on.
  int send_block() const {
    const int r = comm_.rank_, k = reducing() ? step_ : step_ - (p_ - 1);
    return ((reducing() ? r - k : r + 1 - k) % p_ + p_) % p_;
  }
  int recv_block() const { return (send_block() - 1 + p_) % p_; }

  // Posts the current piece of the current step.
  void post() {
    const auto [s0, s1] = block_range(send_block());
    const auto [r0, r1] = block_range(recv_block());
    const int sc = static_cast<int>(std::clamp<int64_t>(s1 - s0 - offset_, 0, kRingPieceElems));
    recv_count_ = static_cast<int>(std::clamp<int64_t>(r1 - r0 - offset_, 0, kRingPieceElems));
    recv_at_ = tensor_.f32() + r0 + offset_;
    const int right = (comm_.rank_ + 1) % p_, left = (comm_.rank_ + p_ - 1) % p_;
    comm_.check(MPI_Irecv(reducing() ? scratch_.data() : recv_at_, recv_count_, MPI_FLOAT, left, tag_, comm_.comm_,
                          &requests_[0]),
                "ring all-reduce (MPI_Irecv)");
    comm_.check(MPI_Isend(tensor_.f32() + s0 + offset_, sc, MPI_FLOAT, right, tag_, comm_.comm_, &requests_[1]),
                "ring all-reduce (MPI_Isend)");
  }

  // The current piece is through: add it in (reduce-scatter), then post the next piece or step.
  void arrived() {
    if (reducing()) {
      const float* in = scratch_.data();
      float* out = recv_at_;
      for (int i = 0; i < recv_count_; ++i) out[i] += in[i];
    }
    const auto [s0, s1] = block_range(send_block());
    const auto [r0, r1] = block_range(recv_block());
    offset_ += kRingPieceElems;
    if (offset_ >= std::max(s1 - s0, r1 - r0)) offset_ = 0, ++step_;
    if (in_flight()) {
      post();
    } else {
      comm_.ring_scratch_.push_back(std::move(scratch_));
      tensor_ = Tensor();
    }
  }

  MpiCommunicator& comm_;
  Tensor tensor_;
  const int64_t n_;
  const int p_;
  const int64_t block_;
  const int tag_;
  int step_ = 0;
  int64_t offset_ = 0;  // of the current piece within the step's blocks
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  float* recv_at_ = nullptr;
  int recv_count_ = 0;
  std::vector<float> scratch_;
};

std::unique_ptr<PendingSend> MpiCommunicator::start_ring(Tensor& t) {
  bytes_moved_ += t.numel() * static_cast<int64_t>(sizeof(float));
  return std::make_unique<PendingRing>(*this, t);
}

std::unique_ptr<PendingSend> MpiCommunicator::all_reduce_async(Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce_async");
  if (t.dtype() != DType::F32) return Communicator::all_reduce_async(t, op);  // 16-bit: the blocking path
  if (op == ReduceOp::Sum && size_ > 1 && t.numel() * int64_t(sizeof(float)) >= kRingMinBytes) return start_ring(t);
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
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (static_cast<int>(counts.size()) != size_ || total != t.numel())
    throw std::invalid_argument("MpiCommunicator(" + name_ + ")::reduce_scatter_blocks_async: " +
                                std::to_string(counts.size()) + " blocks of " + std::to_string(total) +
                                " elements in all, for a group of " + std::to_string(size_) +
                                " and a tensor of " + std::to_string(t.numel()));
  if (t.dtype() != DType::F32) return Communicator::reduce_scatter_blocks_async(t, counts);
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
