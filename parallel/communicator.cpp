// SelfCommunicator: the single-rank group used when a parallel dimension has degree 1.
#include "parallel/communicator.h"

#include <cstring>
#include <stdexcept>

namespace gpt {

namespace {
struct CompletedSend final : PendingSend {
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingSend> Communicator::send_async(const Tensor& t, int peer, int tag) {
  send(t, peer, tag);
  return std::make_unique<CompletedSend>();
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
