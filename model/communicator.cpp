// SelfCommunicator: the single-rank group used when a parallel dimension has degree 1; the default
// asynchronous send and reductions (the blocking ones, run at once); the marker that tells the watchdog
// this process is waiting in communication.
#include "model/communicator.h"

#include <cstring>
#include <mutex>
#include <stdexcept>

namespace gpt {

namespace {
std::mutex g_marker_mu;
std::string g_marker_group;  // guarded by g_marker_mu

struct CompletedSend final : PendingSend {
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingSend> Communicator::send_async(const Tensor& t, int peer, int tag) {
  send(t, peer, tag);
  return std::make_unique<CompletedSend>();
}

namespace {
// exchange_async's default: the send in flight, the receive run by wait().
class DeferredReceive final : public PendingSend {
 public:
  DeferredReceive(Communicator& comm, std::unique_ptr<PendingSend> send, Tensor& in, int from, int tag)
      : comm_(comm), send_(std::move(send)), in_(in), from_(from), tag_(tag) {}
  ~DeferredReceive() override {
    if (!done_) try {
        wait();
      } catch (...) {  // a destructor must not throw; the error surfaced (or will) through the group
      }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    comm_.recv(in_, from_, tag_);
    send_->wait();
  }
  void progress() override { send_->progress(); }

 private:
  Communicator& comm_;
  std::unique_ptr<PendingSend> send_;
  Tensor in_;
  int from_, tag_;
  bool done_ = false;
};
}  // namespace

std::unique_ptr<PendingSend> Communicator::exchange_async(const Tensor& out, int to, Tensor& in, int from, int tag) {
  auto send = send_async(out, to, tag);
  return std::make_unique<DeferredReceive>(*this, std::move(send), in, from, tag);
}

std::unique_ptr<PendingSend> Communicator::all_reduce_async(Tensor& t, ReduceOp op) {
  all_reduce(t, op);
  return std::make_unique<CompletedSend>();
}

void Communicator::check_block_counts(const std::vector<int64_t>& counts, int64_t numel,
                                      const std::string& who) const {
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 0)
      throw std::invalid_argument(who + "::reduce_scatter_blocks_async: block " + std::to_string(r) + " has " +
                                  std::to_string(counts[r]) + " elements");
    total += counts[r];
  }
  if (static_cast<int>(counts.size()) != size() || total != numel)
    throw std::invalid_argument(who + "::reduce_scatter_blocks_async: " + std::to_string(counts.size()) +
                                " blocks of " + std::to_string(total) + " elements in all, for a group of " +
                                std::to_string(size()) + " and a tensor of " + std::to_string(numel));
}

std::unique_ptr<PendingSend> Communicator::reduce_scatter_blocks_async(Tensor& t, const std::vector<int64_t>& counts) {
  check_block_counts(counts, t.numel(), "Communicator(" + name() + ")");
  if (size() > 1) all_reduce(t);  // every block summed: this rank's among them
  return std::make_unique<CompletedSend>();
}

CommunicationMarker::CommunicationMarker(const std::string& group) {
  std::lock_guard<std::mutex> lock(g_marker_mu);
  g_marker_group = group;
}

CommunicationMarker::~CommunicationMarker() {
  std::lock_guard<std::mutex> lock(g_marker_mu);
  g_marker_group.clear();
}

std::string CommunicationMarker::current() {
  std::lock_guard<std::mutex> lock(g_marker_mu);
  return g_marker_group;
}

static void copy_same(const Tensor& in, Tensor& out, const char* what) {
  if (in.bytes() != out.bytes())
    throw std::invalid_argument(std::string("SelfCommunicator::") + what + ": size mismatch");
  if (in.raw() != out.raw()) std::memcpy(out.raw(), in.raw(), in.bytes());
}

void SelfCommunicator::all_gather(const Tensor& in, Tensor& out) { copy_same(in, out, "all_gather"); }
void SelfCommunicator::reduce_scatter(const Tensor& in, Tensor& out) { copy_same(in, out, "reduce_scatter"); }
void SelfCommunicator::send(const Tensor&, int peer, int) {
  throw std::logic_error("SelfCommunicator(" + name_ + "): send to peer " + std::to_string(peer) + " in a group of one");
}
void SelfCommunicator::recv(Tensor&, int peer, int) {
  throw std::logic_error("SelfCommunicator(" + name_ + "): recv from peer " + std::to_string(peer) + " in a group of one");
}

}  // namespace gpt
