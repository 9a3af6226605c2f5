// NcclCommunicator: the Communicator interface over NCCL for tensors in GPU memory, bootstrapped over the
// group's MPI communicator (rank 0 of the group calls ncclGetUniqueId and broadcasts the id over MPI,
// then every member joins with ncclCommInitRank). Built only with GPT_HAVE_NCCL.
//
// Streams. NCCL work runs on the communicator's own stream(s), ordered after everything already queued on
// the CUDA backend's compute stream (an event recorded there is waited on first). Blocking-style ops
// (all_reduce, all_gather, reduce_scatter, broadcast, send, recv) then make the compute stream wait for
// the result, so later kernels see it, but the host returns at once. all_reduce_async,
// reduce_scatter_blocks_async and send_async leave the compute stream free until wait(): that is how a
// data-parallel bucket reduction overlaps the rest of the backward pass. Every use of a tensor on a communication stream is joined back into the
// compute stream before the tensor can be freed, which keeps the caching allocator's stream-order
// argument (model/ops/cuda/cuda_allocator.h) valid.
//
// Point-to-point. NCCL matches sends to receives in posting order and has no tags, while callers (the
// pipeline executor) match by tag and receive in an order of their own. So every send also posts a small
// MPI header (tag, bytes) to the receiver; recv(tag) reads headers from that peer in order, receiving any
// earlier message it is not yet asked for into a stash buffer, and takes a stashed message directly when
// one waits. That reproduces MPI's tag matching with buffered non-blocking sends, the rule under which
// the pipeline schedules are proven deadlock-free (parallel/pipeline/pipeline_schedule.h). With `p2p_channels`
// (the pipeline group) every ordered pair of ranks gets its own two-rank NCCL communicator and stream, so
// sends to one peer never queue behind receives from another; without it p2p uses the group's main
// communicator, which is enough for occasional transfers that do not interleave with collectives.
//
// Reductions take F32, BF16 and F16 (and I32) tensors; data movement moves raw bytes of any dtype.
// Host tensors (small control data such as checkpoint metadata) are passed on to the host group's MPI
// communicator, as are all_reduce_host and barrier. Times in seconds_spent() are measured with CUDA events on the
// communication streams and collected as the events complete.
#pragma once
#ifdef GPT_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <deque>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/communicator.h"
#include "model/ops/backend.h"

namespace gpt {

namespace cuda {
class WaitChecks;
}

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the ranks of `host_group` (an MpiCommunicator, or a SelfCommunicator for a group of
  // one); takes it over for the bootstrap, host reductions and p2p headers. `backend` must be the CUDA
  // backend whose compute stream the communicator follows.
  NcclCommunicator(std::unique_ptr<Communicator> host_group, Backend& backend, bool p2p_channels);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  void all_reduce_host(double* data, int64_t count, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void send(const Tensor& t, int peer, int tag) override;
  void recv(Tensor& t, int peer, int tag) override;
  // The send and the receive both enqueued at once on their channels' streams; wait() joins them.
  std::unique_ptr<PendingSend> exchange_async(const Tensor& out, int to, Tensor& in, int from, int tag) override;
  std::unique_ptr<PendingSend> send_async(const Tensor& t, int peer, int tag) override;
  // Waits (host side) for this communicator's queued work, then an MPI barrier.
  void barrier() override;

  // Start an in-place all-reduce, or a reduce-scatter of unequal blocks (ncclReduceScatter when the blocks
  // are equal, else one ncclReduce per non-empty block to its rank, grouped), on the communication stream
  // and return at once; the compute stream is not held up. wait() (or destroying the handle) makes the
  // compute stream wait for the result. `t` must not be written by kernels queued between this call and
  // wait().
  std::unique_ptr<PendingSend> all_reduce_async(Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  std::unique_ptr<PendingSend> reduce_scatter_blocks_async(Tensor& t, const std::vector<int64_t>& counts) override;
  cudaStream_t comm_stream() const { return stream_; }
  // Polls each of this group's NCCL communicators for an asynchronous error (a peer that died or became
  // unreachable); on one, aborts them all, so that no kernel of theirs waits on, and throws naming the
  // group, this rank and the communicator (every other group of the process is aborted too). The CUDA
  // backend runs it while the host waits for the device.
  void poll_async_errors();

 private:
  struct Channel {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    int peer = 0;  // the other end's rank inside `comm`
  };
  struct Stashed {
    Tensor buffer;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  struct Header {
    int64_t tag = 0;
    int64_t bytes = 0;
  };
  struct PostedHeader {
    Header header;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  class Pending;

  void check(ncclResult_t r, ncclComm_t comm, const char* op) const;
  void check_cuda(cudaError_t e, const char* op) const;
  void check_tensor(const Tensor& t, const char* op, const char* arg) const;
  void check_peer(int peer, const char* op) const;
  bool on_host(const Tensor& t) const;
  ncclDataType_t reduce_type(const Tensor& t, const char* op) const;
  void make_channels();
  void abort_all();  // ncclCommAbort on every communicator of the group, once
  // After an asynchronous error: every live NcclCommunicator of the process aborts its communicators, so
  // that no other group's kernels keep the device (and the unwinding destructors) waiting.
  static void abort_every_group();
  void wait_stream(cudaStream_t stream, const char* op);  // polling, with poll_async_errors

  cudaEvent_t take_event(bool timing);
  void give_event(cudaEvent_t e, bool timing);
  // Makes `stream` wait for the work queued so far on the compute stream and starts a timing interval.
  void begin(cudaStream_t stream);
  // Ends the timing interval on `stream`; returns an event marking the end of the work just queued.
  cudaEvent_t end(cudaStream_t stream);
  void join_compute(cudaEvent_t done);  // compute stream waits for `done`
  void collect_timings();
  void reap_headers(bool wait_all);

  Channel out_channel(int peer) const;
  Channel in_channel(int peer) const;
  void post_header(int peer, int tag, size_t bytes);
  Header read_header(int peer);
  // Enqueues the NCCL send of t's bytes to peer; returns the event marking its completion.
  cudaEvent_t enqueue_send(const Tensor& t, int peer);
  cudaEvent_t enqueue_recv(void* dst, size_t bytes, int peer);
  // recv's body: with `join` the compute stream waits for the message (nullptr returned); without, a
  // directly received message's completion event is returned for the caller to join (nullptr when it came
  // from the stash, already copied in compute-stream order).
  cudaEvent_t receive(Tensor& t, int peer, int tag, bool join);

  std::unique_ptr<Communicator> host_;
  MPI_Comm mpi_ = MPI_COMM_NULL;  // private duplicate of host_'s communicator; null for a group of one
  Backend& backend_;
  std::shared_ptr<cuda::WaitChecks> wait_checks_;  // the CUDA backend's, which this registers with
  bool aborted_ = false;
  cudaStream_t compute_ = nullptr;
  std::string name_;
  int rank_ = 0, size_ = 1;
  int device_ = 0;

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::map<int, Channel> out_channels_, in_channels_;  // by peer, with p2p_channels

  std::vector<cudaEvent_t> free_timing_events_, free_plain_events_;
  std::deque<std::pair<cudaEvent_t, cudaEvent_t>> timings_;  // (start, stop) not yet collected
  cudaEvent_t open_start_ = nullptr;                         // start of the interval begin() opened
  std::list<PostedHeader> headers_;
  std::map<std::pair<int, int64_t>, Stashed> stash_;  // (peer, tag) -> message received ahead of its recv
};

}  // namespace gpt
#endif  // GPT_HAVE_NCCL
