// Communicator: the collective and point-to-point operations the model and the parallel engine need,
// over one group of ranks. Backends: SelfCommunicator (a group of one: every op is the identity), the MPI
// backend (parallel/comm/mpi_communicator.*) and NCCL (parallel/comm/nccl_communicator.*). Every backend reduces
// F32, BF16 and F16 tensors (a bf16 or fp16 run's activations cross the tensor-parallel group in that
// dtype) and moves tensors of any dtype; `all_reduce_host` reduces small host arrays (scalars, norms, flags).
// The non-blocking reductions (all_reduce_async, reduce_scatter_blocks_async) are what the data-parallel
// gradient buckets use to overlap their reductions with the rest of the backward pass.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/tensor.h"

namespace gpt {

enum class ReduceOp { Sum, Max, Min };

// A send or collective that may still be in flight; wait() returns once the buffer may be reused (and,
// for a reduction, holds its result). Destroying an unfinished one waits for it.
class PendingSend {
 public:
  virtual ~PendingSend() = default;
  virtual void wait() = 0;
  // Lets communication that advances only inside library calls (MPI on the host) move on, without
  // blocking. Backends whose transfers run by themselves (NCCL on its streams) ignore it.
  virtual void progress() {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "tp", "dp", "pp", "world"

  virtual void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  virtual void all_reduce_host(double* data, int64_t count, ReduceOp op = ReduceOp::Sum) = 0;
  // out holds size() * in.numel() elements: rank r's `in` lands at [r * n, (r + 1) * n).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // in holds size() * out.numel() elements; rank r receives the sum of every rank's block r.
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void send(const Tensor& t, int peer, int tag) = 0;
  virtual void recv(Tensor& t, int peer, int tag) = 0;
  // Starts a send and returns at once (the pipeline executor posts every send this way, so a schedule
  // whose data dependencies are satisfiable can never deadlock on p2p). `t` must stay alive until wait().
  // The default is a blocking send.
  virtual std::unique_ptr<PendingSend> send_async(const Tensor& t, int peer, int tag);
  // Sends `out` to `to` and receives `in` from `from` (one ring step: context parallelism's K/V blocks),
  // returning at once; after wait() `in` holds the message and `out` may be reused. Both must stay alive
  // until then. The default starts send_async and receives in wait(); MPI posts both at once.
  virtual std::unique_ptr<PendingSend> exchange_async(const Tensor& out, int to, Tensor& in, int from, int tag);
  virtual void barrier() = 0;

  // Non-blocking reductions: each starts and returns at once; `t` must stay alive and untouched until the
  // handle's wait() (or destruction), after which it holds the result. Every rank of the group must start
  // the group's non-blocking reductions in the same order, and wait for them in the same order too (the MPI
  // communicator's rings move on only inside their own progress() and wait()). The defaults run the
  // blocking collectives.
  // In-place reduction of t over the group.
  virtual std::unique_ptr<PendingSend> all_reduce_async(Tensor& t, ReduceOp op = ReduceOp::Sum);
  // t is cut into consecutive blocks of counts[0], counts[1], ... elements, one per rank of the group (they
  // add up to t.numel(); a block may be empty). Afterwards this rank's block of t holds the group's sum of
  // that block; the other blocks are unspecified. (A bucket of a flat gradient buffer reduced to the ranks
  // that own its pieces: the distributed optimizer's reduce-scatter, one bucket at a time.)
  virtual std::unique_ptr<PendingSend> reduce_scatter_blocks_async(Tensor& t, const std::vector<int64_t>& counts);

  // Bytes this rank has passed to collectives / p2p since construction (for the comm-volume log).
  int64_t bytes_moved() const { return bytes_moved_; }
  double seconds_spent() const { return seconds_spent_; }

 protected:
  // reduce_scatter_blocks_async's argument check: one count per rank, none negative, adding up to numel.
  // `who` names the caller in the error, e.g. "MpiCommunicator(dp)".
  void check_block_counts(const std::vector<int64_t>& counts, int64_t numel, const std::string& who) const;

  int64_t bytes_moved_ = 0;
  double seconds_spent_ = 0;
};

// Marks this process as waiting in a communication call of group `group` while it lives (the watchdog's
// census tells a rank that waits for its peers from one that is stuck computing). Not nested.
class CommunicationMarker {
 public:
  explicit CommunicationMarker(const std::string& group);
  ~CommunicationMarker();
  CommunicationMarker(const CommunicationMarker&) = delete;
  CommunicationMarker& operator=(const CommunicationMarker&) = delete;
  // The group this process is communicating in now, or "" when it is not in a communication call.
  static std::string current();
};

// A group of one rank: collectives are identities, p2p is an error.
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name = "self") : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce(Tensor&, ReduceOp) override {}
  void all_reduce_host(double*, int64_t, ReduceOp) override {}
  void all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor&, int) override {}
  void send(const Tensor&, int peer, int) override;
  void recv(Tensor&, int peer, int) override;
  void barrier() override {}

 private:
  std::string name_;
};

}  // namespace gpt
