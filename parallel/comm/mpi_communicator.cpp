// MpiCommunicator: collectives and point-to-point transfers of host tensors over an owned MPI_Comm, with
// argument checks before every MPI call, MPI error codes turned into exceptions, large messages split into
// pieces MPI's int counts can address, 16-bit reductions carried out in fp32, and the bytes/seconds
// accounting behind the comm-volume log.
#include "parallel/comm/mpi_communicator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <stdexcept>

#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {
namespace {

// Messages larger than this travel as several MPI messages (MPI counts are int).
constexpr size_t kChunkBytes = size_t(1) << 30;
constexpr int64_t kCollectiveChunkBytes = MpiCommunicator::kCollectiveChunkBytes;
constexpr int64_t kReduceChunkElems = MpiCommunicator::kReduceChunkElems;

// Adds the wall time of a scope to a counter.
class ScopedTimer {
 public:
  ScopedTimer(double& total, const std::string& group)
      : total_(total), start_(std::chrono::steady_clock::now()), marker_(group) {}
  ~ScopedTimer() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
  CommunicationMarker marker_;
};

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

// An element type of the same width as the dtype: data movement never interprets the values.
MPI_Datatype raw_type(DType t) {
  switch (dtype_size(t)) {
    case 4: return MPI_UINT32_T;
    case 2: return MPI_UINT16_T;
    default: return MPI_BYTE;
  }
}

// [offset, offset + length) pieces of a message; a zero-byte message is one empty piece so that a
// zero-byte send still matches its zero-byte receive.
std::vector<std::pair<size_t, int>> byte_chunks(size_t bytes) {
  std::vector<std::pair<size_t, int>> out;
  size_t offset = 0;
  do {
    size_t len = std::min(kChunkBytes, bytes - offset);
    out.emplace_back(offset, static_cast<int>(len));
    offset += len;
  } while (offset < bytes);
  return out;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace

// ---- MpiRequest ----

MpiRequest::MpiRequest(MpiRequest&& o) noexcept
    : comm_(o.comm_), requests_(std::move(o.requests_)), buffer_(std::move(o.buffer_)), is_recv_(o.is_recv_),
      peer_(o.peer_), tag_(o.tag_) {
  o.requests_.clear();
}

MpiRequest& MpiRequest::operator=(MpiRequest&& o) noexcept {
  if (this != &o) {
    if (pending() && comm_) {
      try {
        comm_->wait(*this);
      } catch (const std::exception& e) {
        spdlog::error("discarding a failed MPI request: {}", e.what());
      }
    }
    comm_ = o.comm_;
    requests_ = std::move(o.requests_);
    o.requests_.clear();
    buffer_ = std::move(o.buffer_);
    is_recv_ = o.is_recv_;
    peer_ = o.peer_;
    tag_ = o.tag_;
  }
  return *this;
}

MpiRequest::~MpiRequest() {
  if (!pending() || !comm_) return;
  try {
    comm_->wait(*this);
  } catch (const std::exception& e) {
    spdlog::error("MPI request completed with an error while being destroyed: {}", e.what());
  }
}

// ---- construction ----

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
  if (flag && ub) tag_ub_ = *ub - kRingTags;  // the top tags are the ring all-reduces' own (parallel/comm/mpi_ring.cpp)
}

static void require_mpi(const std::string& what) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw std::runtime_error("MpiCommunicator '" + what + "': MPI is not initialised (or already finalised)");
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::dup(MPI_Comm parent, std::string name) {
  require_mpi(name);
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(parent, &comm);
  if (rc != MPI_SUCCESS) throw std::runtime_error("MPI_Comm_dup failed while creating group '" + name + "'");
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(comm, std::move(name)));
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(MPI_Comm parent, int color, int key, std::string name) {
  require_mpi(name);
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_split(parent, color < 0 ? MPI_UNDEFINED : color, key, &comm);
  if (rc != MPI_SUCCESS) throw std::runtime_error("MPI_Comm_split failed while creating group '" + name + "'");
  if (comm == MPI_COMM_NULL) return nullptr;
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(comm, std::move(name)));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

// ---- checks ----

void MpiCommunicator::check(int rc, const char* op) const {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(op) + " failed on group '" + name_ + "' (rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_) + ", world rank " + std::to_string(world_rank_) +
                           "): " + std::string(text, len));
}

void MpiCommunicator::check_tensor(const Tensor& t, const char* op) const {
  std::string where = "MpiCommunicator(" + name_ + ")::" + op + ": ";
  if (!t.defined()) throw std::invalid_argument(where + "tensor is undefined");
  if (t.device() != Device::CPU)
    throw std::invalid_argument(where + "the MPI backend needs host tensors, got a CUDA tensor");
}

void MpiCommunicator::check_peer(int peer, int tag, const char* op, bool allow_self) const {
  std::string where = "MpiCommunicator(" + name_ + ")::" + op + ": ";
  if (peer < 0 || peer >= size_)
    throw std::invalid_argument(where + "peer " + std::to_string(peer) + " is outside the group of " +
                                std::to_string(size_));
  if (!allow_self && peer == rank_)
    throw std::invalid_argument(where + "blocking transfer with itself (rank " + std::to_string(rank_) +
                                ") would never complete; use exchange");
  if (tag < 0 || tag > tag_ub_)
    throw std::invalid_argument(where + "tag " + std::to_string(tag) + " is outside [0, " + std::to_string(tag_ub_) +
                                "]");
}

static void require_float(const Tensor& t, const std::string& group, const char* op) {
  if (t.dtype() != DType::F32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16)
    throw std::invalid_argument("MpiCommunicator(" + group + ")::" + op +
                                ": reductions need float tensors (fp32, bf16, fp16), got " + dtype_name(t.dtype()));
}

// ---- collectives ----

// A 16-bit tensor is widened piece by piece into fp32 scratch, reduced as floats and rounded back (to
// nearest even) once: a sum is the group's fp32 sum rounded a single time, not once per partial sum, and
// Max and Min come back exact. The fp32 pieces are what MPI moves, so they are what is counted.
void MpiCommunicator::all_reduce(Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce");
  require_float(t, name_, "all_reduce");
  const int64_t total = t.numel();
  const bool wide = t.dtype() == DType::F32;
  if (wide && op == ReduceOp::Sum && size_ > 1 && total * int64_t(sizeof(float)) >= kRingMinBytes) {
    start_ring_all_reduce(t)->wait();  // counts its own bytes and time
    return;
  }
  ScopedTimer timer(seconds_spent_, name_);
  std::vector<float> scratch(wide ? 0 : static_cast<size_t>(std::min(kReduceChunkElems, total)));
  char* base = static_cast<char*>(t.raw());
  const int64_t esize = dtype_size(t.dtype());
  for (int64_t start = 0; start < total; start += kReduceChunkElems) {
    int n = static_cast<int>(std::min(kReduceChunkElems, total - start));
    float* buf = wide ? t.f32() + start : scratch.data();
    if (!wide) cpu::to_f32(base + start * esize, t.dtype(), buf, n);
    check(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, mpi_op(op), comm_), "MPI_Allreduce");
    if (!wide) cpu::from_f32(buf, base + start * esize, t.dtype(), n);
  }
  bytes_moved_ += total * static_cast<int64_t>(sizeof(float));
}

void MpiCommunicator::all_reduce_host(double* data, int64_t count, ReduceOp op) {
  if (count < 0 || (count > 0 && !data))
    throw std::invalid_argument("MpiCommunicator(" + name_ + ")::all_reduce_host: bad buffer");
  ScopedTimer timer(seconds_spent_, name_);
  for (int64_t start = 0; start < count; start += kReduceChunkElems) {
    int n = static_cast<int>(std::min(kReduceChunkElems, count - start));
    check(MPI_Allreduce(MPI_IN_PLACE, data + start, n, MPI_DOUBLE, mpi_op(op), comm_), "MPI_Allreduce");
  }
  bytes_moved_ += count * static_cast<int64_t>(sizeof(double));
}

void MpiCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_tensor(in, "all_gather");
  check_tensor(out, "all_gather");
  std::string where = "MpiCommunicator(" + name_ + ")::all_gather: ";
  if (in.dtype() != out.dtype()) throw std::invalid_argument(where + "in and out dtypes differ");
  if (out.numel() != in.numel() * size_)
    throw std::invalid_argument(where + "out has " + std::to_string(out.numel()) + " elements, expected " +
                                std::to_string(size_) + " x " + std::to_string(in.numel()));
  const char* my_block = static_cast<const char*>(out.raw()) + rank_ * in.bytes();
  if (in.raw() != my_block && overlaps(in.raw(), in.bytes(), out.raw(), out.bytes()))
    throw std::invalid_argument(where + "in overlaps out but is not this rank's block of it");
  ScopedTimer timer(seconds_spent_, name_);
  MPI_Datatype type = raw_type(in.dtype());
  const int64_t esize = dtype_size(in.dtype()), n = in.numel();
  const int64_t piece = std::max<int64_t>(1, kCollectiveChunkBytes / esize / size_);
  if (n <= piece) {
    const void* send = in.raw() == my_block ? MPI_IN_PLACE : in.raw();  // `in` may already be its block
    check(MPI_Allgather(send, static_cast<int>(n), type, out.raw(), static_cast<int>(n), type, comm_),
          "MPI_Allgather");
  } else {
    // Piece by piece (see kCollectiveChunkBytes): gather the same slice of every block into scratch, then
    // place each rank's part. When `in` is this rank's block, only that slice of it is rewritten, with
    // the same bytes, after it has been sent.
    std::vector<char> gathered(static_cast<size_t>(piece * esize * size_));
    const char* src = static_cast<const char*>(in.raw());
    char* dst = static_cast<char*>(out.raw());
    for (int64_t off = 0; off < n; off += piece) {
      const int len = static_cast<int>(std::min(piece, n - off));
      check(MPI_Allgather(src + off * esize, len, type, gathered.data(), len, type, comm_), "MPI_Allgather");
      for (int k = 0; k < size_; ++k)
        std::memcpy(dst + (int64_t(k) * n + off) * esize, gathered.data() + int64_t(k) * len * esize,
                    size_t(len) * esize);
    }
  }
  bytes_moved_ += in.bytes();
}

void MpiCommunicator::reduce_scatter(const Tensor& in, Tensor& out) {
  check_tensor(in, "reduce_scatter");
  check_tensor(out, "reduce_scatter");
  require_float(in, name_, "reduce_scatter");
  std::string where = "MpiCommunicator(" + name_ + ")::reduce_scatter: ";
  if (in.dtype() != out.dtype())
    throw std::invalid_argument(where + "in is " + dtype_name(in.dtype()) + " but out is " + dtype_name(out.dtype()));
  if (in.numel() != out.numel() * size_)
    throw std::invalid_argument(where + "in has " + std::to_string(in.numel()) + " elements, expected " +
                                std::to_string(size_) + " x " + std::to_string(out.numel()));
  ScopedTimer timer(seconds_spent_, name_);
  // Piece by piece: the same slice of every rank's block, packed contiguously in the tensor's own dtype,
  // goes to its owner in one MPI_Alltoall (so no call exceeds kCollectiveChunkBytes), and the owner adds
  // the slices it receives in fp32 in rank order, each sum rounded once. The order is fixed, not MPI's
  // choice: the overlapped reduce-scatter of the tensor-parallel region (model/tp_overlap.h) adds in the
  // same order and gives the same bits. The result goes to fp32 scratch when the output aliases the input
  // (the distributed optimizer reduces a bucket into its own shard this way) or is 16-bit, and is copied
  // or rounded into it at the end.
  const DType dtype = in.dtype();
  const bool wide = dtype == DType::F32;
  const int64_t n = out.numel(), esize = dtype_size(dtype);
  const int64_t piece = std::max<int64_t>(1, std::min(kReduceChunkElems, kCollectiveChunkBytes / esize) / size_);
  const bool alias = overlaps(in.raw(), in.bytes(), out.raw(), out.bytes());
  const size_t slices = static_cast<size_t>(std::min(piece, n) * size_);
  std::vector<char> packed(slices * esize), received(slices * esize);
  std::vector<float> widened(wide ? 0 : slices);
  std::vector<float> result(alias || !wide ? static_cast<size_t>(n) : 0);
  float* dst = alias || !wide ? result.data() : out.f32();
  const char* src = static_cast<const char*>(in.raw());
  for (int64_t off = 0; off < n; off += piece) {
    const int64_t len = std::min(piece, n - off);
    for (int k = 0; k < size_; ++k)
      std::memcpy(packed.data() + int64_t(k) * len * esize, src + (int64_t(k) * n + off) * esize, size_t(len * esize));
    check(MPI_Alltoall(packed.data(), static_cast<int>(len * esize), MPI_BYTE, received.data(),
                       static_cast<int>(len * esize), MPI_BYTE, comm_),
          "MPI_Alltoall");
    const float* parts = reinterpret_cast<const float*>(received.data());
    if (!wide) {
      cpu::to_f32(received.data(), dtype, widened.data(), len * size_);
      parts = widened.data();
    }
    float* sum = dst + off;
    std::memcpy(sum, parts, size_t(len) * sizeof(float));
    for (int k = 1; k < size_; ++k) {
      const float* part = parts + int64_t(k) * len;
      for (int64_t i = 0; i < len; ++i) sum[i] += part[i];
    }
  }
  if (alias || !wide) cpu::from_f32(result.data(), out.raw(), dtype, n);
  bytes_moved_ += in.bytes();
}

void MpiCommunicator::broadcast(Tensor& t, int root) {
  check_tensor(t, "broadcast");
  if (root < 0 || root >= size_)
    throw std::invalid_argument("MpiCommunicator(" + name_ + ")::broadcast: root " + std::to_string(root) +
                                " is outside the group of " + std::to_string(size_));
  ScopedTimer timer(seconds_spent_, name_);
  char* base = static_cast<char*>(t.raw());
  for (auto [offset, len] : byte_chunks(t.bytes()))
    check(MPI_Bcast(base + offset, len, MPI_BYTE, root, comm_), "MPI_Bcast");
  bytes_moved_ += t.bytes();
}

void MpiCommunicator::barrier() {
  ScopedTimer timer(seconds_spent_, name_);
  check(MPI_Barrier(comm_), "MPI_Barrier");
}

// ---- point-to-point ----

void MpiCommunicator::send(const Tensor& t, int peer, int tag) {
  check_tensor(t, "send");
  check_peer(peer, tag, "send", false);
  MpiRequest r;
  post(r, t, false, peer, tag, "MPI_Isend");
  wait(r);
}

void MpiCommunicator::recv(Tensor& t, int peer, int tag) {
  check_tensor(t, "recv");
  check_peer(peer, tag, "recv", false);
  MpiRequest r;
  post(r, t, true, peer, tag, "MPI_Irecv");
  wait(r);
}

MpiRequest MpiCommunicator::isend(const Tensor& t, int peer, int tag) {
  check_tensor(t, "isend");
  check_peer(peer, tag, "isend", true);
  MpiRequest r;
  post(r, t, false, peer, tag, "MPI_Isend");
  return r;
}

namespace {
class MpiPendingSend final : public PendingSend {
 public:
  MpiPendingSend(MpiCommunicator& comm, MpiRequest request) : comm_(comm), request_(std::move(request)) {}
  void wait() override { comm_.wait(request_); }

 private:
  MpiCommunicator& comm_;
  MpiRequest request_;
};

class MpiPendingExchange final : public PendingSend {
 public:
  MpiPendingExchange(MpiCommunicator& comm, std::vector<MpiRequest> requests)
      : comm_(comm), requests_(std::move(requests)) {}
  void wait() override { comm_.wait_all(requests_); }
  void progress() override { comm_.progress_engine(); }

 private:
  MpiCommunicator& comm_;
  std::vector<MpiRequest> requests_;
};
}  // namespace

std::unique_ptr<PendingSend> MpiCommunicator::send_async(const Tensor& t, int peer, int tag) {
  return std::make_unique<MpiPendingSend>(*this, isend(t, peer, tag));
}

std::unique_ptr<PendingSend> MpiCommunicator::exchange_async(const Tensor& out, int to, Tensor& in, int from,
                                                             int tag) {
  std::vector<MpiRequest> requests;
  requests.push_back(irecv(in, from, tag));  // the receive first, so the peer's send finds it posted
  requests.push_back(isend(out, to, tag));
  return std::make_unique<MpiPendingExchange>(*this, std::move(requests));
}

MpiRequest MpiCommunicator::irecv(Tensor& t, int peer, int tag) {
  check_tensor(t, "irecv");
  check_peer(peer, tag, "irecv", true);
  MpiRequest r;
  post(r, t, true, peer, tag, "MPI_Irecv");
  return r;
}

void MpiCommunicator::post(MpiRequest& r, const Tensor& t, bool is_recv, int peer, int tag, const char* op) {
  ScopedTimer timer(seconds_spent_, name_);
  r.comm_ = this;
  r.buffer_ = t;
  r.is_recv_ = is_recv;
  r.peer_ = peer;
  r.tag_ = tag;
  char* base = static_cast<char*>(t.raw());
  for (auto [offset, len] : byte_chunks(t.bytes())) {
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = is_recv ? MPI_Irecv(base + offset, len, MPI_BYTE, peer, tag, comm_, &req)
                     : MPI_Isend(base + offset, len, MPI_BYTE, peer, tag, comm_, &req);
    if (rc != MPI_SUCCESS) {
      // Withdraw the pieces already posted so that nothing writes into the buffer after we throw.
      for (auto& posted : r.requests_) {
        MPI_Cancel(&posted);
        MPI_Wait(&posted, MPI_STATUS_IGNORE);
      }
      r.requests_.clear();
      check(rc, op);
    }
    r.requests_.push_back(req);
  }
  bytes_moved_ += t.bytes();
}

void MpiCommunicator::wait(MpiRequest& request) {
  MpiRequest* one = &request;
  complete(&one, 1);
}

void MpiCommunicator::progress_engine() {
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
}

void MpiCommunicator::wait_all(std::vector<MpiRequest>& requests) {
  std::vector<MpiRequest*> all;
  for (auto& r : requests) all.push_back(&r);
  complete(all.data(), all.size());
}

// One MPI_Waitall over every piece of every request lets MPI progress them in any order; the bookkeeping
// (receive sizes, per-request errors) runs afterwards, and every request is released even when one failed.
void MpiCommunicator::complete(MpiRequest* const* requests, size_t n) {
  std::vector<MPI_Request> pieces;
  for (size_t i = 0; i < n; ++i) {
    MpiRequest& r = *requests[i];
    if (!r.pending()) continue;
    if (r.comm_ != this)
      throw std::invalid_argument("MpiCommunicator(" + name_ + ")::wait: request belongs to another communicator");
    pieces.insert(pieces.end(), r.requests_.begin(), r.requests_.end());
  }
  if (pieces.empty()) return;
  ScopedTimer timer(seconds_spent_, name_);
  std::vector<MPI_Status> statuses(pieces.size());
  int rc = MPI_Waitall(static_cast<int>(pieces.size()), pieces.data(), statuses.data());
  std::string first_error;
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    MpiRequest& r = *requests[i];
    if (!r.pending()) continue;
    auto chunks = byte_chunks(r.buffer_.bytes());
    int error = rc == MPI_ERR_IN_STATUS ? MPI_SUCCESS : rc;
    size_t got = 0;
    bool short_piece = false;
    for (size_t c = 0; c < r.requests_.size(); ++c, ++k) {
      if (rc == MPI_ERR_IN_STATUS && statuses[k].MPI_ERROR != MPI_SUCCESS) error = statuses[k].MPI_ERROR;
      if (!r.is_recv_) continue;
      int count = 0;
      MPI_Get_count(&statuses[k], MPI_BYTE, &count);
      got += count;
      if (count != chunks[c].second) short_piece = true;
    }
    const char* op = r.is_recv_ ? "MPI_Irecv" : "MPI_Isend";
    std::string what = std::string(r.is_recv_ ? "recv from" : "send to") + " rank " + std::to_string(r.peer_) +
                       " tag " + std::to_string(r.tag_);
    size_t expected = r.buffer_.bytes();
    r.requests_.clear();
    r.buffer_ = Tensor();
    if (!first_error.empty()) continue;
    if (error != MPI_SUCCESS) {
      try {
        check(error, (std::string(op) + " (" + what + ")").c_str());
      } catch (const std::exception& e) {
        first_error = e.what();
      }
    } else if (short_piece) {
      first_error = "MpiCommunicator(" + name_ + ")::" + what + " got " + std::to_string(got) + " bytes, expected " +
                    std::to_string(expected) + " (rank " + std::to_string(rank_) + ", world rank " +
                    std::to_string(world_rank_) + ")";
    }
  }
  if (!first_error.empty()) throw std::runtime_error(first_error);
}

void MpiCommunicator::exchange(const std::vector<P2POp>& ops) {
  // Check everything before posting anything, so a bad op cannot leave half a batch in flight.
  for (const auto& op : ops) {
    check_tensor(op.tensor, "exchange");
    check_peer(op.peer, op.tag, "exchange", true);
  }
  std::vector<MpiRequest> requests;
  requests.reserve(ops.size());
  for (const auto& op : ops)
    if (op.kind == P2POp::Kind::Recv) {
      requests.emplace_back();
      post(requests.back(), op.tensor, true, op.peer, op.tag, "MPI_Irecv");
    }
  for (const auto& op : ops)
    if (op.kind == P2POp::Kind::Send) {
      requests.emplace_back();
      post(requests.back(), op.tensor, false, op.peer, op.tag, "MPI_Isend");
    }
  wait_all(requests);
}

// ---- backend-independent batched exchange ----

void exchange(Communicator& comm, const std::vector<P2POp>& ops) {
  if (auto* mpi = dynamic_cast<MpiCommunicator*>(&comm)) {
    mpi->exchange(ops);
    return;
  }
  std::string where = "exchange on group '" + comm.name() + "': ";
  if (comm.size() != 1) throw std::logic_error(where + "this backend has no batched point-to-point");
  // A group of one: every transfer is with this rank itself. Match sends to receives by tag, in order.
  std::vector<bool> used(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].peer != 0) throw std::invalid_argument(where + "peer " + std::to_string(ops[i].peer) + " in a group of one");
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != P2POp::Kind::Recv) continue;
    size_t j = 0;
    while (j < ops.size() && (used[j] || ops[j].kind != P2POp::Kind::Send || ops[j].tag != ops[i].tag)) ++j;
    if (j == ops.size())
      throw std::logic_error(where + "receive with tag " + std::to_string(ops[i].tag) + " has no matching send");
    if (ops[j].tensor.bytes() != ops[i].tensor.bytes())
      throw std::invalid_argument(where + "send and receive with tag " + std::to_string(ops[i].tag) +
                                  " differ in size");
    used[j] = true;
    std::memmove(ops[i].tensor.raw(), ops[j].tensor.raw(), ops[i].tensor.bytes());
  }
  for (size_t j = 0; j < ops.size(); ++j)
    if (ops[j].kind == P2POp::Kind::Send && !used[j])
      throw std::logic_error(where + "send with tag " + std::to_string(ops[j].tag) + " has no matching receive");
}

}  // namespace gpt
