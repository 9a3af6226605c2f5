// The MPI communicator's own ring reductions of fp32 host tensors, over MPI_Isend/MPI_Irecv with the two
// neighbours: the all-reduce (reduce-scatter, then all-gather) behind every large fp32 sum, and the
// reduce-scatter into blocks of any sizes behind the distributed optimizer's gradient buckets. Both run in
// place, with no buffer allocated per call (Open MPI's libnbc allocates and copies one, and inside a
// training step its pages fault in anew every time). The tensor is cut into one block per rank, and each
// block into pieces; piece j of every block forms column j, and each column is its own small ring, so up
// to kRingLanes columns travel at once: a block that holds most of a bucket (a distributed-optimizer
// bucket inside one rank's shard) streams round the ring in pieces instead of hopping round it whole.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "parallel/comm/mpi_communicator.h"

namespace gpt {

namespace {
// Each lane in flight holds a receive buffer of one piece (two ranks: 3.4-3.9 GB/s at 1 MiB, as at 8 MiB).
constexpr int64_t kRingPieceElems = MpiCommunicator::kRingMinBytes / 4;
constexpr int kRingLanes = 8;                                        // columns in flight per ring, at most
constexpr int kRingSlots = MpiCommunicator::kRingTags / kRingLanes;  // rings in flight per group, at most
}  // namespace

// Reduce-scatter step k (k < p - 1): rank r sends its partial sum of block (r - k - 1) mod p to the right
// and adds the left neighbour's partial sum of block (r - k - 2) mod p into its own, so after p - 1 steps
// block r is complete on rank r. All-gather step k: rank r sends block (r - k) mod p, complete, and
// receives block (r - k - 1) mod p in place. Each block's sum is formed once, in an order fixed by the
// group's size, then copied: every rank gets the same bits.
class MpiCommunicator::PendingRing final : public PendingSend {
 public:
  // bounds: p + 1 offsets into t, block b is [bounds[b], bounds[b + 1]).
  PendingRing(MpiCommunicator& comm, Tensor t, std::vector<int64_t> bounds, bool all_gather)
      : comm_(comm), tensor_(std::move(t)), bounds_(std::move(bounds)), p_(comm.size_),
        steps_(all_gather ? 2 * (p_ - 1) : p_ - 1), slot_(static_cast<int>(comm.rings_started_++ % kRingSlots)) {
    // A slot's tags are reused only once its previous ring is through, so no two rings in flight ever
    // match each other's messages. Every rank starts the group's rings in the same order, so they all wait
    // for the same ring here.
    if (comm_.live_rings_.empty()) comm_.live_rings_.assign(kRingSlots, nullptr);
    if (PendingRing* older = comm_.live_rings_[slot_]) older->wait();
    int64_t longest = 0;
    for (int b = 0; b < p_; ++b) longest = std::max(longest, bounds_[b + 1] - bounds_[b]);
    columns_ = (longest + kRingPieceElems - 1) / kRingPieceElems;
    const int lanes = static_cast<int>(std::min<int64_t>(columns_, std::clamp(p_ - 1, 1, kRingLanes)));
    if (lanes == 0) return;
    if (!comm_.ring_scratch_.empty()) {
      scratch_ = std::move(comm_.ring_scratch_.back());
      comm_.ring_scratch_.pop_back();
    }
    stride_ = std::min(longest, kRingPieceElems);
    scratch_.resize(static_cast<size_t>(lanes * stride_));
    lanes_.resize(static_cast<size_t>(lanes));
    requests_.assign(2 * static_cast<size_t>(lanes), MPI_REQUEST_NULL);
    comm_.live_rings_[slot_] = this;
    registered_ = true;
    for (int l = 0; l < lanes; ++l) start_column(l, l);
  }
  // Touches the communicator only while the ring is in flight (a finished handle may outlive it).
  ~PendingRing() override {
    try {
      wait();
    } catch (const std::exception& e) {
      spdlog::error("MPI ring reduction completed with an error while being destroyed: {}", e.what());
    }
  }

  void progress() override {
    while (active_ > 0) {
      int count = 0;
      check(MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &count, done_.data(),
                         MPI_STATUSES_IGNORE),
            "ring reduction (MPI_Testsome)");
      if (!advance_finished_lanes()) return;
    }
  }

  void wait() override {
    if (active_ == 0) return;
    const auto start = std::chrono::steady_clock::now();
    {
      CommunicationMarker marker(comm_.name_);
      while (active_ > 0) {
        int count = 0;
        check(MPI_Waitsome(static_cast<int>(requests_.size()), requests_.data(), &count, done_.data(),
                           MPI_STATUSES_IGNORE),
              "ring reduction (MPI_Waitsome)");
        advance_finished_lanes();
      }
    }
    comm_.seconds_spent_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  struct Lane {
    int64_t column = -1;  // -1: idle
    int step = 0;
    float* recv_at = nullptr;
    int64_t recv_count = 0;
  };

  bool reducing(const Lane& l) const { return l.step < p_ - 1; }
  // Column `column`'s piece of block b: [begin, end) of the tensor (empty where the block is shorter).
  std::pair<int64_t, int64_t> piece(int b, int64_t column) const {
    const int64_t begin = std::min(bounds_[b + 1], bounds_[b] + column * kRingPieceElems);
    return {begin, std::min(bounds_[b + 1], begin + kRingPieceElems)};
  }
  int send_block(const Lane& l) const {
    const int r = comm_.rank_;
    const int b = reducing(l) ? r - l.step - 1 : r - (l.step - (p_ - 1));
    return (b % p_ + p_) % p_;
  }
  int recv_block(const Lane& l) const { return (send_block(l) - 1 + p_) % p_; }

  // Lane l takes columns l, l + lanes, l + 2 lanes, ...: a fixed assignment, because the lanes' tags must
  // pair the same columns on every rank whatever order the lanes finish in.
  void start_column(int lane, int64_t column) {
    Lane& l = lanes_[lane];
    if (column >= columns_) {
      l.column = -1;
      return;
    }
    l.column = column;
    l.step = 0;
    ++active_;
    post(lane);
  }

  // Posts lane's receive and send of its current step.
  void post(int lane) {
    Lane& l = lanes_[lane];
    const auto [s0, s1] = piece(send_block(l), l.column);
    const auto [r0, r1] = piece(recv_block(l), l.column);
    l.recv_at = tensor_.f32() + r0;
    l.recv_count = r1 - r0;
    float* into = reducing(l) ? scratch_.data() + lane * stride_ : l.recv_at;
    const int right = (comm_.rank_ + 1) % p_, left = (comm_.rank_ + p_ - 1) % p_;
    const int tag = comm_.tag_ub_ + 1 + slot_ * kRingLanes + lane;
    check(MPI_Irecv(into, static_cast<int>(l.recv_count), MPI_FLOAT, left, tag, comm_.comm_, &requests_[2 * lane]),
          "ring reduction (MPI_Irecv)");
    check(MPI_Isend(tensor_.f32() + s0, static_cast<int>(s1 - s0), MPI_FLOAT, right, tag, comm_.comm_,
                    &requests_[2 * lane + 1]),
          "ring reduction (MPI_Isend)");
  }

  // Moves on every lane whose send and receive are both through; false when none was.
  bool advance_finished_lanes() {
    bool moved = false;
    for (int lane = 0; lane < static_cast<int>(lanes_.size()); ++lane) {
      Lane& l = lanes_[lane];
      if (l.column < 0 || requests_[2 * lane] != MPI_REQUEST_NULL || requests_[2 * lane + 1] != MPI_REQUEST_NULL)
        continue;
      moved = true;
      if (reducing(l)) {
        const float* in = scratch_.data() + lane * stride_;
        float* out = l.recv_at;
        for (int64_t i = 0; i < l.recv_count; ++i) out[i] += in[i];
      }
      if (++l.step < steps_) {
        post(lane);
        continue;
      }
      --active_;
      start_column(lane, l.column + static_cast<int64_t>(lanes_.size()));
    }
    if (active_ == 0 && registered_) {
      comm_.live_rings_[slot_] = nullptr;
      registered_ = false;
      comm_.ring_scratch_.push_back(std::move(scratch_));
      tensor_ = Tensor();
    }
    return moved;
  }

  // An MPI call failed: the ring stops where it is, for good, and the error is thrown. Requests may still
  // be posted into the scratch and the tensor, so the communicator keeps both until it is freed.
  void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    active_ = 0;
    for (Lane& l : lanes_) l.column = -1;
    if (registered_) comm_.live_rings_[slot_] = nullptr;
    registered_ = false;
    comm_.abandoned_ring_buffers_.emplace_back(std::move(scratch_), tensor_);
    comm_.check(rc, what);
  }

  MpiCommunicator& comm_;
  Tensor tensor_;
  const std::vector<int64_t> bounds_;
  const int p_;
  const int steps_;
  const int slot_;
  int64_t columns_ = 0;
  int64_t stride_ = 0;  // of the lanes' pieces in scratch_
  int active_ = 0;          // lanes with a column in flight
  bool registered_ = false;  // in comm_.live_rings_ (from the first post until done or failed)
  std::vector<Lane> lanes_;
  std::vector<MPI_Request> requests_;  // lane l: [2l] its receive, [2l + 1] its send
  std::vector<int> done_ = std::vector<int>(2 * kRingLanes);
  std::vector<float> scratch_;  // lane l's reduce-scatter piece lands at l * stride_
};

std::unique_ptr<PendingSend> MpiCommunicator::start_ring_all_reduce(Tensor& t) {
  bytes_moved_ += t.numel() * static_cast<int64_t>(sizeof(float));
  std::vector<int64_t> bounds(size_ + 1);
  const int64_t block = (t.numel() + size_ - 1) / size_;
  for (int b = 0; b <= size_; ++b) bounds[b] = std::min(t.numel(), b * block);
  return std::make_unique<PendingRing>(*this, t, std::move(bounds), true);
}

std::unique_ptr<PendingSend> MpiCommunicator::start_ring_reduce_scatter(Tensor& t, const std::vector<int64_t>& counts) {
  bytes_moved_ += t.numel() * static_cast<int64_t>(sizeof(float));
  std::vector<int64_t> bounds(size_ + 1, 0);
  for (int b = 0; b < size_; ++b) bounds[b + 1] = bounds[b] + counts[b];
  return std::make_unique<PendingRing>(*this, t, std::move(bounds), false);
}

}  // namespace gpt
