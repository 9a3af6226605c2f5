// NCCL communicator: MPI bootstrap of the group's NCCL communicator (and of the per-pair p2p channels),
// stream and event plumbing between the compute stream and the communication streams, the collectives,
// and tag-matched point-to-point over MPI headers (see nccl_communicator.h). Compiled to nothing unless
// the build found NCCL (GPT_HAVE_NCCL).
#ifdef GPT_HAVE_NCCL
#include "parallel/comm/nccl_communicator.h"

#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>

#include "model/ops/cuda/cuda_backend.h"
#include "parallel/comm/mpi_communicator.h"

namespace gpt {

namespace {

// MPI tags on the communicator's private duplicate of the group's MPI communicator, so they can never
// meet a message of the host group's own users.
constexpr int kHeaderTag = 1;
constexpr int kChannelIdTag = 2;

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    default: return ncclSum;
  }
}

// Every NcclCommunicator of the process, for abort_every_group.
std::mutex& live_mutex() {
  static std::mutex mu;
  return mu;
}
std::set<NcclCommunicator*>& live_groups() {
  static std::set<NcclCommunicator*> groups;
  return groups;
}

std::string mpi_error(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, len);
}

}  // namespace

// A collective or send still running on a communication stream.
class NcclCommunicator::Pending final : public PendingSend {
 public:
  Pending(NcclCommunicator* comm, Tensor tensor, cudaEvent_t done)
      : comm_(comm), tensor_(std::move(tensor)), done_(done) {}
  ~Pending() override { wait(); }
  void wait() override {
    if (!done_) return;
    comm_->join_compute(done_);
    comm_->give_event(done_, false);
    done_ = nullptr;
    tensor_ = Tensor();  // later kernels that reuse the memory are queued after the join
  }

 private:
  NcclCommunicator* comm_;
  Tensor tensor_;
  cudaEvent_t done_;
};

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> host_group, Backend& backend, bool p2p_channels)
    : host_(std::move(host_group)), backend_(backend) {
  if (!host_) throw std::invalid_argument("NcclCommunicator: no host group given");
  name_ = host_->name();
  rank_ = host_->rank();
  size_ = host_->size();
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda)
    throw std::runtime_error("NcclCommunicator(" + name_ + "): needs the CUDA backend, got backend '" + backend.name() +
                             "'");
  compute_ = cuda->stream();
  device_ = cuda->device_index();
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  if (size_ > 1) {
    auto* mpi = dynamic_cast<MpiCommunicator*>(host_.get());
    if (!mpi)
      throw std::runtime_error("NcclCommunicator(" + name_ + "): a group of " + std::to_string(size_) +
                               " ranks needs an MPI communicator for its bootstrap");
    const int rc = MPI_Comm_dup(mpi->handle(), &mpi_);
    if (rc != MPI_SUCCESS)
      throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) +
                               ": MPI_Comm_dup failed: " + mpi_error(rc));
    MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN);
  }
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  ncclUniqueId id{};
  if (rank_ == 0) check(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
  if (size_ > 1) {
    const int rc = MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_);
    if (rc != MPI_SUCCESS)
      throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) +
                               ": broadcasting the NCCL id over MPI failed: " + mpi_error(rc));
  }
  check(ncclCommInitRank(&comm_, size_, id, rank_), nullptr, "ncclCommInitRank");
  if (p2p_channels && size_ > 1) make_channels();
  wait_checks_ = cuda->wait_checks();
  wait_checks_->add(this, [this] { poll_async_errors(); });
  std::lock_guard<std::mutex> lock(live_mutex());
  live_groups().insert(this);
}

// ---- asynchronous errors ----

void NcclCommunicator::poll_async_errors() {
  if (aborted_) return;
  const auto state_of = [](ncclComm_t c) {
    ncclResult_t state = ncclSuccess;
    if (c == nullptr || ncclCommGetAsyncError(c, &state) != ncclSuccess || state == ncclInProgress) return ncclSuccess;
    return state;
  };
  ncclComm_t failed = nullptr;
  ncclResult_t state = state_of(comm_);
  std::string where = "the group's communicator";
  if (state != ncclSuccess) failed = comm_;
  for (auto* channels : {&out_channels_, &in_channels_})
    for (auto& [peer, ch] : *channels) {
      if (failed) break;
      state = state_of(ch.comm);
      if (state == ncclSuccess) continue;
      failed = ch.comm;
      where = std::string("the point-to-point channel ") + (channels == &out_channels_ ? "to" : "from") + " rank " +
              std::to_string(peer);
    }
  if (!failed) return;
  const char* last = ncclGetLastError(failed);
  const std::string detail = last && *last ? std::string(" (") + last + ")" : "";
  abort_every_group();
  throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) +
                           ": NCCL reported an asynchronous error on " + where + ": " + ncclGetErrorString(state) +
                           detail + "; a rank of this group (ranks 0-" + std::to_string(size_ - 1) +
                           ") has failed or cannot be reached. Its NCCL communicators are aborted.");
}

void NcclCommunicator::abort_all() {
  if (aborted_) return;
  aborted_ = true;
  for (auto* channels : {&out_channels_, &in_channels_})
    for (auto& [peer, ch] : *channels)
      if (ch.comm) {
        ncclCommAbort(ch.comm);
        ch.comm = nullptr;
      }
  if (comm_) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void NcclCommunicator::abort_every_group() {
  std::lock_guard<std::mutex> lock(live_mutex());
  for (NcclCommunicator* c : live_groups()) c->abort_all();
}

void NcclCommunicator::wait_stream(cudaStream_t stream, const char* op) {
  check_cuda(cuda::poll_until_idle(stream, [this] { poll_async_errors(); }), op);
}

void NcclCommunicator::make_channels() {
  // One two-rank communicator per ordered pair (sender, receiver): the sender makes its id and sends it
  // over MPI, the receiver receives it; all inits of this rank then complete together in one NCCL group.
  std::vector<ncclUniqueId> out_ids(size_), in_ids(size_);
  std::vector<MPI_Request> requests;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    check(ncclGetUniqueId(&out_ids[q]), nullptr, "ncclGetUniqueId");
    requests.emplace_back();
    MPI_Irecv(&in_ids[q], sizeof(ncclUniqueId), MPI_BYTE, q, kChannelIdTag, mpi_, &requests.back());
    requests.emplace_back();
    MPI_Isend(&out_ids[q], sizeof(ncclUniqueId), MPI_BYTE, q, kChannelIdTag, mpi_, &requests.back());
  }
  const int rc = MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS)
    throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) +
                             ": exchanging p2p channel ids failed: " + mpi_error(rc));
  check(ncclGroupStart(), nullptr, "ncclGroupStart");
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    Channel& out = out_channels_[q];
    Channel& in = in_channels_[q];
    out.peer = 1;  // the sender is rank 0 of its pair, the receiver rank 1
    in.peer = 0;
    check(ncclCommInitRank(&out.comm, 2, out_ids[q], 0), nullptr, "ncclCommInitRank (p2p channel)");
    check(ncclCommInitRank(&in.comm, 2, in_ids[q], 1), nullptr, "ncclCommInitRank (p2p channel)");
  }
  check(ncclGroupEnd(), nullptr, "ncclGroupEnd (p2p channels)");
  for (auto* channels : {&out_channels_, &in_channels_})
    for (auto& [peer, ch] : *channels) check_cuda(cudaStreamCreateWithFlags(&ch.stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

NcclCommunicator::~NcclCommunicator() {
  if (wait_checks_) wait_checks_->remove(this);
  {
    std::lock_guard<std::mutex> lock(live_mutex());
    live_groups().erase(this);
  }
  // Nothing may be in flight when the communicators go; errors are ignored (destructors cannot throw). A
  // communicator that died is aborted first, so that the waits below end.
  try {
    poll_async_errors();
  } catch (...) {
  }
  cudaStreamSynchronize(stream_);
  for (auto* channels : {&out_channels_, &in_channels_})
    for (auto& [peer, ch] : *channels)
      if (ch.stream) cudaStreamSynchronize(ch.stream);
  try {
    reap_headers(true);
  } catch (...) {
  }
  for (auto& [key, s] : stash_)
    if (s.done) cudaEventDestroy(s.done);
  stash_.clear();
  for (auto* channels : {&out_channels_, &in_channels_})
    for (auto& [peer, ch] : *channels) {
      if (ch.comm) ncclCommDestroy(ch.comm);
      if (ch.stream) cudaStreamDestroy(ch.stream);
    }
  if (comm_) ncclCommDestroy(comm_);
  if (stream_) cudaStreamDestroy(stream_);
  if (mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
  for (auto& [start, stop] : timings_) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  if (open_start_) cudaEventDestroy(open_start_);
  for (cudaEvent_t e : free_timing_events_) cudaEventDestroy(e);
  for (cudaEvent_t e : free_plain_events_) cudaEventDestroy(e);
}

// ---- checks ----

void NcclCommunicator::check(ncclResult_t r, ncclComm_t comm, const char* op) const {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(comm);
  throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) + ": " + op +
                           " failed: " + ncclGetErrorString(r) + (last && *last ? std::string(" (") + last + ")" : ""));
}

void NcclCommunicator::check_cuda(cudaError_t e, const char* op) const {
  if (e != cudaSuccess)
    throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) + ": " + op +
                             " failed: " + cudaGetErrorString(e));
}

void NcclCommunicator::check_tensor(const Tensor& t, const char* op, const char* arg) const {
  if (!t.defined() || t.device() != Device::CUDA)
    throw std::invalid_argument("NcclCommunicator(" + name_ + ")::" + op + ": " + arg +
                                " must be a defined tensor in GPU memory");
}

void NcclCommunicator::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw std::invalid_argument("NcclCommunicator(" + name_ + ")::" + op + ": rank " + std::to_string(rank_) +
                                " cannot exchange with peer " + std::to_string(peer) + " in a group of " +
                                std::to_string(size_));
}

ncclDataType_t NcclCommunicator::reduce_type(const Tensor& t, const char* op) const {
  switch (t.dtype()) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::F64: return ncclFloat64;
  }
  throw std::invalid_argument(std::string("NcclCommunicator::") + op + ": unsupported dtype");
}

// ---- events and streams ----

cudaEvent_t NcclCommunicator::take_event(bool timing) {
  auto& pool = timing ? free_timing_events_ : free_plain_events_;
  if (!pool.empty()) {
    cudaEvent_t e = pool.back();
    pool.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate");
  return e;
}

void NcclCommunicator::give_event(cudaEvent_t e, bool timing) {
  (timing ? free_timing_events_ : free_plain_events_).push_back(e);
}

void NcclCommunicator::begin(cudaStream_t stream) {
  if (aborted_)
    throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) +
                             ": the group's NCCL communicators were aborted after an asynchronous error");
  collect_timings();
  cudaEvent_t ready = take_event(false);
  check_cuda(cudaEventRecord(ready, compute_), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
  give_event(ready, false);  // the wait has captured it; re-recording later does not affect it
  open_start_ = take_event(true);
  check_cuda(cudaEventRecord(open_start_, stream), "cudaEventRecord");
}

cudaEvent_t NcclCommunicator::end(cudaStream_t stream) {
  cudaEvent_t stop = take_event(true);
  check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
  timings_.emplace_back(open_start_, stop);
  open_start_ = nullptr;
  cudaEvent_t done = take_event(false);
  check_cuda(cudaEventRecord(done, stream), "cudaEventRecord");
  return done;
}

void NcclCommunicator::join_compute(cudaEvent_t done) {
  check_cuda(cudaStreamWaitEvent(compute_, done, 0), "cudaStreamWaitEvent");
}

void NcclCommunicator::collect_timings() {
  while (!timings_.empty()) {
    auto [start, stop] = timings_.front();
    const cudaError_t q = cudaEventQuery(stop);
    if (q == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is not an error; keep it out of later launch checks
      break;
    }
    float ms = 0.f;
    if (q == cudaSuccess && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess) seconds_spent_ += ms / 1e3;
    timings_.pop_front();
    give_event(start, true);
    give_event(stop, true);
  }
}

// ---- collectives ----

bool NcclCommunicator::on_host(const Tensor& t) const { return t.defined() && t.device() == Device::CPU; }

std::unique_ptr<PendingSend> NcclCommunicator::all_reduce_async(Tensor& t, ReduceOp op) {
  if (on_host(t)) {
    host_->all_reduce(t, op);
    return std::make_unique<Pending>(this, Tensor(), nullptr);
  }
  check_tensor(t, "all_reduce", "t");
  const ncclDataType_t type = reduce_type(t, "all_reduce");
  begin(stream_);
  check(ncclAllReduce(t.raw(), t.raw(), t.numel(), type, nccl_op(op), comm_, stream_), comm_, "ncclAllReduce");
  bytes_moved_ += static_cast<int64_t>(t.bytes());
  return std::make_unique<Pending>(this, t, end(stream_));
}

void NcclCommunicator::all_reduce(Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }

std::unique_ptr<PendingSend> NcclCommunicator::reduce_scatter_blocks_async(Tensor& t,
                                                                          const std::vector<int64_t>& counts) {
  if (on_host(t)) {
    auto done = host_->reduce_scatter_blocks_async(t, counts);
    done->wait();
    return std::make_unique<Pending>(this, Tensor(), nullptr);
  }
  check_tensor(t, "reduce_scatter_blocks_async", "t");
  check_block_counts(counts, t.numel(), "NcclCommunicator(" + name_ + ")");
  bool equal = true;
  for (int64_t c : counts) equal = equal && c == counts.front();
  const ncclDataType_t type = reduce_type(t, "reduce_scatter_blocks_async");
  const size_t esize = dtype_size(t.dtype());
  char* base = static_cast<char*>(t.raw());
  begin(stream_);
  if (equal) {  // in place: this rank's block is where NCCL puts its result
    check(ncclReduceScatter(base, base + rank_ * counts.front() * esize, counts.front(), type, ncclSum, comm_, stream_),
          comm_, "ncclReduceScatter");
  } else {
    check(ncclGroupStart(), comm_, "ncclGroupStart");
    int64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      if (counts[r] > 0)
        check(ncclReduce(base + offset * esize, base + offset * esize, counts[r], type, ncclSum, r, comm_, stream_),
              comm_, "ncclReduce");
      offset += counts[r];
    }
    check(ncclGroupEnd(), comm_, "ncclGroupEnd");
  }
  bytes_moved_ += static_cast<int64_t>(t.bytes());
  return std::make_unique<Pending>(this, t, end(stream_));
}

void NcclCommunicator::all_reduce_host(double* data, int64_t count, ReduceOp op) {
  collect_timings();
  host_->all_reduce_host(data, count, op);
}

void NcclCommunicator::all_gather(const Tensor& in, Tensor& out) {
  if (on_host(in) && on_host(out)) return host_->all_gather(in, out);
  check_tensor(in, "all_gather", "in");
  check_tensor(out, "all_gather", "out");
  if (in.dtype() != out.dtype() || out.bytes() != in.bytes() * size_)
    throw std::invalid_argument("NcclCommunicator(" + name_ + ")::all_gather: out " + shape_str(out.shape()) + " " +
                                dtype_name(out.dtype()) + " must hold " + std::to_string(size_) + " x in " +
                                shape_str(in.shape()) + " " + dtype_name(in.dtype()));
  begin(stream_);
  check(ncclAllGather(in.raw(), out.raw(), in.bytes(), ncclUint8, comm_, stream_), comm_, "ncclAllGather");
  bytes_moved_ += static_cast<int64_t>(out.bytes());
  Pending(this, out, end(stream_)).wait();
}

void NcclCommunicator::reduce_scatter(const Tensor& in, Tensor& out) {
  if (on_host(in) && on_host(out)) return host_->reduce_scatter(in, out);
  check_tensor(in, "reduce_scatter", "in");
  check_tensor(out, "reduce_scatter", "out");
  if (in.dtype() != out.dtype() || in.numel() != out.numel() * size_)
    throw std::invalid_argument("NcclCommunicator(" + name_ + ")::reduce_scatter: in " + shape_str(in.shape()) + " " +
                                dtype_name(in.dtype()) + " must hold " + std::to_string(size_) + " x out " +
                                shape_str(out.shape()) + " " + dtype_name(out.dtype()));
  const ncclDataType_t type = reduce_type(out, "reduce_scatter");
  begin(stream_);
  check(ncclReduceScatter(in.raw(), out.raw(), out.numel(), type, ncclSum, comm_, stream_), comm_,
        "ncclReduceScatter");
  bytes_moved_ += static_cast<int64_t>(in.bytes());
  Pending(this, out, end(stream_)).wait();
}

void NcclCommunicator::broadcast(Tensor& t, int root) {
  if (on_host(t)) return host_->broadcast(t, root);
  check_tensor(t, "broadcast", "t");
  if (root < 0 || root >= size_)
    throw std::invalid_argument("NcclCommunicator(" + name_ + ")::broadcast: root " + std::to_string(root) +
                                " is outside the group of " + std::to_string(size_));
  begin(stream_);
  check(ncclBroadcast(t.raw(), t.raw(), t.bytes(), ncclUint8, root, comm_, stream_), comm_, "ncclBroadcast");
  bytes_moved_ += static_cast<int64_t>(t.bytes());
  Pending(this, t, end(stream_)).wait();
}

void NcclCommunicator::barrier() {
  wait_stream(stream_, "barrier");
  for (auto& [peer, ch] : out_channels_) wait_stream(ch.stream, "barrier");
  for (auto& [peer, ch] : in_channels_) wait_stream(ch.stream, "barrier");
  collect_timings();
  host_->barrier();
}

// ---- point to point ----

NcclCommunicator::Channel NcclCommunicator::out_channel(int peer) const {
  auto it = out_channels_.find(peer);
  // Without a channel: the group's own communicator, where the peer is addressed by its group rank.
  return it != out_channels_.end() ? it->second : Channel{comm_, stream_, peer};
}

NcclCommunicator::Channel NcclCommunicator::in_channel(int peer) const {
  auto it = in_channels_.find(peer);
  return it != in_channels_.end() ? it->second : Channel{comm_, stream_, peer};
}

void NcclCommunicator::reap_headers(bool wait_all) {
  for (auto it = headers_.begin(); it != headers_.end();) {
    int done = 0;
    const int rc = wait_all ? MPI_Wait(&it->request, MPI_STATUS_IGNORE) : MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) +
                               ": p2p header send failed: " + mpi_error(rc));
    if (wait_all || done)
      it = headers_.erase(it);
    else
      ++it;
  }
}

void NcclCommunicator::post_header(int peer, int tag, size_t bytes) {
  reap_headers(false);
  headers_.emplace_back();
  PostedHeader& h = headers_.back();
  h.header = Header{tag, static_cast<int64_t>(bytes)};
  const int rc = MPI_Isend(&h.header, 2, MPI_INT64_T, peer, kHeaderTag, mpi_, &h.request);
  if (rc != MPI_SUCCESS)
    throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) + ": header to peer " +
                             std::to_string(peer) + " failed: " + mpi_error(rc));
}

NcclCommunicator::Header NcclCommunicator::read_header(int peer) {
  Header h;
  const int rc = MPI_Recv(&h, 2, MPI_INT64_T, peer, kHeaderTag, mpi_, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS)
    throw std::runtime_error("NcclCommunicator(" + name_ + ") rank " + std::to_string(rank_) +
                             ": header from peer " + std::to_string(peer) + " failed: " + mpi_error(rc));
  return h;
}

cudaEvent_t NcclCommunicator::enqueue_send(const Tensor& t, int peer) {
  const Channel ch = out_channel(peer);
  begin(ch.stream);
  if (t.bytes() > 0) {
    check(ncclGroupStart(), ch.comm, "ncclGroupStart");
    check(ncclSend(t.raw(), t.bytes(), ncclUint8, ch.peer, ch.comm, ch.stream), ch.comm, "ncclSend");
    check(ncclGroupEnd(), ch.comm, "ncclGroupEnd");
  }
  bytes_moved_ += static_cast<int64_t>(t.bytes());
  return end(ch.stream);
}

cudaEvent_t NcclCommunicator::enqueue_recv(void* dst, size_t bytes, int peer) {
  const Channel ch = in_channel(peer);
  begin(ch.stream);
  if (bytes > 0) {
    check(ncclGroupStart(), ch.comm, "ncclGroupStart");
    check(ncclRecv(dst, bytes, ncclUint8, ch.peer, ch.comm, ch.stream), ch.comm, "ncclRecv");
    check(ncclGroupEnd(), ch.comm, "ncclGroupEnd");
  }
  bytes_moved_ += static_cast<int64_t>(bytes);
  return end(ch.stream);
}

std::unique_ptr<PendingSend> NcclCommunicator::send_async(const Tensor& t, int peer, int tag) {
  if (on_host(t)) return host_->send_async(t, peer, tag);
  check_tensor(t, "send", "t");
  check_peer(peer, "send");
  post_header(peer, tag, t.bytes());
  return std::make_unique<Pending>(this, t, enqueue_send(t, peer));
}

void NcclCommunicator::send(const Tensor& t, int peer, int tag) { send_async(t, peer, tag)->wait(); }

void NcclCommunicator::recv(Tensor& t, int peer, int tag) {
  if (on_host(t)) return host_->recv(t, peer, tag);
  receive(t, peer, tag, true);
}

namespace {
// exchange_async's handle: the send, and the receive the compute stream joins in wait().
class NcclExchange final : public PendingSend {
 public:
  NcclExchange(std::unique_ptr<PendingSend> send, std::function<void()> join)
      : send_(std::move(send)), join_(std::move(join)) {}
  ~NcclExchange() override { wait(); }
  void wait() override {
    if (send_) send_->wait(), send_.reset();
    if (join_) join_(), join_ = nullptr;
  }

 private:
  std::unique_ptr<PendingSend> send_;
  std::function<void()> join_;
};
}  // namespace

std::unique_ptr<PendingSend> NcclCommunicator::exchange_async(const Tensor& out, int to, Tensor& in, int from,
                                                              int tag) {
  if (on_host(out) || on_host(in)) return Communicator::exchange_async(out, to, in, from, tag);
  auto send = send_async(out, to, tag);
  // The receive is enqueued now (after the compute queued so far), so it runs beside what the caller
  // queues next; only wait() makes the compute stream wait for it.
  cudaEvent_t done = receive(in, from, tag, false);
  return std::make_unique<NcclExchange>(std::move(send), [this, done, keep = in]() mutable {
    if (done) {
      join_compute(done);
      give_event(done, false);
    }
    keep = Tensor();
  });
}

cudaEvent_t NcclCommunicator::receive(Tensor& t, int peer, int tag, bool join) {
  check_tensor(t, "recv", "t");
  check_peer(peer, "recv");
  auto wrong_size = [&](int64_t bytes) {
    return std::runtime_error("NcclCommunicator(" + name_ + ")::recv: rank " + std::to_string(rank_) +
                              " expected " + std::to_string(t.bytes()) + " bytes from peer " + std::to_string(peer) +
                              " with tag " + std::to_string(tag) + " but the message holds " + std::to_string(bytes));
  };
  auto stashed = stash_.find({peer, tag});
  if (stashed == stash_.end()) {
    // Read this peer's headers in posting order until ours arrives; earlier messages go to the stash.
    for (;;) {
      const Header h = read_header(peer);
      if (h.tag == tag) {
        if (h.bytes != static_cast<int64_t>(t.bytes())) {
          // Take the message anyway, so the channel stays in step with the sender, then report.
          Tensor drain = backend_.empty({(h.bytes + 3) / 4});
          cudaEvent_t done = enqueue_recv(drain.raw(), static_cast<size_t>(h.bytes), peer);
          join_compute(done);
          give_event(done, false);
          throw wrong_size(h.bytes);
        }
        cudaEvent_t done = enqueue_recv(t.raw(), t.bytes(), peer);
        if (!join) return done;
        join_compute(done);
        give_event(done, false);
        return nullptr;
      }
      const std::pair<int, int64_t> key{peer, h.tag};
      if (stash_.count(key))
        throw std::runtime_error("NcclCommunicator(" + name_ + ")::recv: peer " + std::to_string(peer) +
                                 " sent tag " + std::to_string(h.tag) + " twice before it was received");
      Stashed s;
      s.bytes = static_cast<size_t>(h.bytes);
      s.buffer = backend_.empty({(h.bytes + 3) / 4});
      s.done = enqueue_recv(s.buffer.raw(), s.bytes, peer);
      stash_.emplace(key, std::move(s));
    }
  }
  Stashed& s = stashed->second;
  join_compute(s.done);
  give_event(s.done, false);
  if (s.bytes != t.bytes()) {
    const int64_t bytes = static_cast<int64_t>(s.bytes);
    stash_.erase(stashed);
    throw wrong_size(bytes);
  }
  if (s.bytes > 0)
    check_cuda(cudaMemcpyAsync(t.raw(), s.buffer.raw(), s.bytes, cudaMemcpyDeviceToDevice, compute_),
               "cudaMemcpyAsync");
  stash_.erase(stashed);  // the buffer is freed after the copy in compute-stream order
  return nullptr;         // already in compute-stream order
}

}  // namespace gpt
#endif  // GPT_HAVE_NCCL
