// MpiCommunicator: the Communicator interface over one MPI communicator, for host (CPU) tensors. It owns
// its MPI_Comm (made by duplicating or splitting a parent, freed on destruction) and sets MPI_ERRORS_RETURN
// on it, so an MPI failure becomes a std::runtime_error naming the operation, the group, the rank and MPI's
// own error string instead of aborting the job. Reductions (all_reduce, reduce_scatter) take F32, BF16 and
// F16 tensors; 16-bit ones are reduced in fp32 and rounded back to nearest even once. reduce_scatter adds
// the ranks' blocks in rank order (an Alltoall, then the owner's sum), the order model/tp_overlap.h's
// overlapped reduce-scatter keeps, not the one MPI_Reduce_scatter would pick. Data movement
// (all_gather, broadcast, send/recv) moves raw bytes and so takes any dtype (F32, BF16, F16, I32). Besides
// the blocking point-to-point ops it offers non-blocking isend/irecv and a batched `exchange` that posts a
// set of sends and receives together and waits for all of them: a pipeline stage that sends to its
// neighbour while receiving from it cannot deadlock that way. The non-blocking reductions of gradient
// buckets (all_reduce_async, reduce_scatter_blocks_async with a count per rank) take fp32 tensors: from
// kRingMinBytes up they run as this class's own rings, below that as Open MPI's non-blocking collectives in
// the same pieces as the blocking ones; other dtypes reduce at once.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/communicator.h"

namespace gpt {

class MpiCommunicator;

// A pending non-blocking send or receive. Move-only; it keeps the tensor's storage alive until completed.
// Destroying a pending request waits for it, so a buffer can never be freed while MPI still uses it. A
// request must be completed before the communicator that made it is destroyed.
class MpiRequest {
 public:
  MpiRequest() = default;
  MpiRequest(MpiRequest&& other) noexcept;
  MpiRequest& operator=(MpiRequest&& other) noexcept;
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;
  ~MpiRequest();

  bool pending() const { return !requests_.empty(); }

 private:
  friend class MpiCommunicator;
  MpiCommunicator* comm_ = nullptr;
  std::vector<MPI_Request> requests_;  // one per chunk: messages over 1 GiB travel in pieces
  Tensor buffer_;
  bool is_recv_ = false;
  int peer_ = -1;
  int tag_ = 0;
};

// One half of a point-to-point transfer for `exchange`.
struct P2POp {
  enum class Kind { Send, Recv };
  Kind kind = Kind::Send;
  Tensor tensor;  // for Recv: the destination, already shaped
  int peer = 0;   // rank in the communicator
  int tag = 0;
  static P2POp send(const Tensor& t, int peer, int tag) { return {Kind::Send, t, peer, tag}; }
  static P2POp recv(const Tensor& t, int peer, int tag) { return {Kind::Recv, t, peer, tag}; }
};

class MpiCommunicator final : public Communicator {
 public:
  // A private duplicate of `parent` (collective over parent).
  static std::unique_ptr<MpiCommunicator> dup(MPI_Comm parent, std::string name);
  // Collective over parent: ranks passing the same color form one group, ordered by key. Ranks passing a
  // negative color get nullptr (they belong to no group).
  static std::unique_ptr<MpiCommunicator> split(MPI_Comm parent, int color, int key, std::string name);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  // Reductions and gathers run as calls of at most this many bytes in all. Open MPI 4.1's shared-memory
  // collectives fall off a cliff above about 16 MiB per call (two ranks, measured: MPI_Allreduce 7 GB/s at
  // 8 MiB, 0.4 GB/s at 32 MiB and above; MPI_Reduce_scatter likewise; MPI_Reduce_scatter_block 0.2 GB/s
  // at every size; MPI_Allgather 6 GB/s at 32 MiB, 2 GB/s at 128 MiB), while 8 MiB pieces keep the fast path.
  static constexpr int64_t kCollectiveChunkBytes = int64_t(8) << 20;
  static constexpr int64_t kReduceChunkElems = kCollectiveChunkBytes / 4;
  // fp32 sums of at least this many bytes, blocking or not, and non-blocking reduce-scatters as large, run
  // as this class's own rings (parallel/comm/mpi_ring.cpp, over MPI_Isend/MPI_Irecv with the neighbours)
  // instead of MPI_Allreduce / MPI_Iallreduce / MPI_Ireduce_scatter. Open MPI's non-blocking collectives
  // (libnbc) allocate and copy a temporary buffer of the whole piece on every call, and inside a training
  // step, where the heap is trimmed between calls, those pages fault in again each time: config M's 120 MB
  // gradient reduction over two ranks cost about 0.5 s per step on a 2-vCPU VM, against 30 ms for the same
  // bytes warm.
  static constexpr int64_t kRingMinBytes = int64_t(1) << 20;
  // Tags at the top of MPI's range reserved for rings in flight: each ring takes a slot of 8 (one per
  // column in flight), and a slot is reused only once its previous ring is through, so the messages of two
  // rings between the same neighbours never match each other's receives. 16 slots: at most 16 rings in
  // flight per group, so their receive scratch (up to 8 one-MiB pieces each) stays within 128 MiB per
  // group however many buckets a step posts; a 17th ring first completes the oldest.
  static constexpr int kRingTags = 16 * 8;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  MPI_Comm handle() const { return comm_; }
  // This rank's rank in MPI_COMM_WORLD (for error messages and layout checks).
  int world_rank() const { return world_rank_; }

  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  void all_reduce_host(double* data, int64_t count, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  // Blocking; peer must not be this rank (a blocking send to oneself may never return).
  void send(const Tensor& t, int peer, int tag) override;
  // Blocking; throws if the message that arrives is not exactly t.bytes() long.
  void recv(Tensor& t, int peer, int tag) override;
  void barrier() override;

  // Communicator::send_async over isend: the returned handle waits for the request.
  std::unique_ptr<PendingSend> send_async(const Tensor& t, int peer, int tag) override;
  // isend and irecv posted together; the handle waits for both.
  std::unique_ptr<PendingSend> exchange_async(const Tensor& out, int to, Tensor& in, int from, int tag) override;
  std::unique_ptr<PendingSend> all_reduce_async(Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  std::unique_ptr<PendingSend> reduce_scatter_blocks_async(Tensor& t, const std::vector<int64_t>& counts) override;
  MpiRequest isend(const Tensor& t, int peer, int tag);
  MpiRequest irecv(Tensor& t, int peer, int tag);
  void wait(MpiRequest& request);
  void wait_all(std::vector<MpiRequest>& requests);
  // Lets MPI move messages in flight (a probe: requests are left to wait), for transfers that advance
  // only inside library calls.
  void progress_engine();
  // Posts every receive, then every send, then waits for all. Sends to and receives from this rank itself
  // are allowed (they match each other by tag).
  void exchange(const std::vector<P2POp>& ops);

 private:
  class PendingReduction;
  MpiCommunicator(MPI_Comm comm, std::string name);
  void check(int rc, const char* op) const;
  void check_tensor(const Tensor& t, const char* op) const;
  void check_peer(int peer, int tag, const char* op, bool allow_self) const;
  void post(MpiRequest& request, const Tensor& t, bool is_recv, int peer, int tag, const char* op);
  void complete(MpiRequest* const* requests, size_t n);
  class PendingRing;
  std::unique_ptr<PendingSend> start_ring_all_reduce(Tensor& t);
  std::unique_ptr<PendingSend> start_ring_reduce_scatter(Tensor& t, const std::vector<int64_t>& counts);

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = 0;
  int tag_ub_ = 32767 - kRingTags;  // the largest tag callers may use: MPI_TAG_UB less the rings' tags
  int64_t rings_started_ = 0;         // picks each ring's tag; rings start in the same order on every rank
  std::vector<std::vector<float>> ring_scratch_;  // receive buffers of finished rings, for the next ones
  std::vector<PendingRing*> live_rings_;          // per tag slot: the ring in flight on it, or nullptr
  // Scratch and tensor of rings whose MPI calls failed, with requests perhaps still posted into them.
  std::vector<std::pair<std::vector<float>, Tensor>> abandoned_ring_buffers_;
};

// Batched point-to-point on any communicator: MpiCommunicator posts the whole batch at once; a group of one
// (SelfCommunicator) matches each send to peer 0 with the receive of the same tag and copies. Other
// backends are rejected rather than run sequentially, which could deadlock.
void exchange(Communicator& comm, const std::vector<P2POp>& ops);

}  // namespace gpt
