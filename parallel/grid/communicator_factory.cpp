// Choice of communicators per backend: NCCL (or MPI through host memory) for GPU groups of several ranks, a
// device-aware identity for GPU groups of one (SelfCommunicator copies with memcpy, which cannot touch GPU
// memory), MPI otherwise.
#include "parallel/grid/communicator_factory.h"

#include <spdlog/spdlog.h>

#include <stdexcept>
#include <string>

#include "parallel/comm/staged_communicator.h"

#ifdef GPT_HAVE_NCCL
#include "parallel/comm/nccl_communicator.h"
#endif

namespace gpt {

namespace {

// A group of one on a GPU backend: collectives are identities, gathers and scatters are device copies on
// the backend's stream, p2p is an error.
class DeviceSelfCommunicator final : public Communicator {
 public:
  DeviceSelfCommunicator(std::string name, Backend& backend) : name_(std::move(name)), backend_(backend) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce(Tensor&, ReduceOp) override {}
  void all_reduce_host(double*, int64_t, ReduceOp) override {}
  void all_gather(const Tensor& in, Tensor& out) override { copy(in, out, "all_gather"); }
  void reduce_scatter(const Tensor& in, Tensor& out) override { copy(in, out, "reduce_scatter"); }
  void broadcast(Tensor&, int) override {}
  void send(const Tensor&, int peer, int) override { no_peer("send", peer); }
  void recv(Tensor&, int peer, int) override { no_peer("recv", peer); }
  void barrier() override {}

 private:
  void copy(const Tensor& in, Tensor& out, const char* what) {
    if (in.dtype() != out.dtype() || in.numel() != out.numel())
      throw std::invalid_argument("DeviceSelfCommunicator(" + name_ + ")::" + what + ": size or dtype mismatch");
    if (in.raw() != out.raw()) backend_.copy(in, out);
  }
  [[noreturn]] void no_peer(const char* what, int peer) const {
    throw std::logic_error("DeviceSelfCommunicator(" + name_ + "): " + what + " with peer " + std::to_string(peer) +
                           " in a group of one");
  }
  std::string name_;
  Backend& backend_;
};

void replace(std::unique_ptr<Communicator>& group, Backend& backend, bool p2p_channels, bool staged) {
  if (!group) return;  // this rank is in no group of this kind (middle pipeline stages: embedding)
  if (group->size() == 1) {
    group = std::make_unique<DeviceSelfCommunicator>(group->name(), backend);
    return;
  }
  if (staged) {
    group = std::make_unique<HostStagedCommunicator>(std::move(group), backend);
    return;
  }
#ifdef GPT_HAVE_NCCL
  group = std::make_unique<NcclCommunicator>(std::move(group), backend, p2p_channels);
#else
  throw std::runtime_error("backend " + backend.name() + ": the '" + group->name() + "' group has " +
                           std::to_string(group->size()) +
                           " ranks, which needs NCCL, but this binary was built without it (install NCCL next to "
                           "the CUDA toolkit and rebuild, or set parallel.communicator: mpi)");
#endif
}

}  // namespace

bool nccl_built_in() {
#ifdef GPT_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

void use_device_communicators(ParallelState& state, Backend& backend, const std::string& communicator) {
  if (communicator != "auto" && communicator != "nccl" && communicator != "mpi")
    throw std::invalid_argument("parallel.communicator: unknown communicator '" + communicator +
                                "' (expected auto, nccl or mpi)");
  if (backend.device() == Device::CPU) return;
  bool staged = communicator == "mpi";
  if (communicator == "auto" && !nccl_built_in()) {
    staged = true;
    spdlog::warn("parallel.communicator auto: this binary has no NCCL, so device tensors cross MPI through host "
                 "memory (slow; build with NCCL for multi-GPU runs)");
  }
  // The same order on every rank, so the collective NCCL initialisations line up.
  replace(state.tp, backend, true, staged);  // p2p: the overlapped region's row-block exchanges (tp_comm_overlap)
  replace(state.dp, backend, false, staged);
  replace(state.pp, backend, true, staged);
  replace(state.embedding, backend, false, staged);
  replace(state.cp, backend, true, staged);  // the ring attention's point-to-point exchanges
}

void use_host_staged_communicators(ParallelState& state, Backend& backend) {
  for (auto* group : {&state.tp, &state.dp, &state.pp, &state.embedding, &state.cp})
    if (*group && (*group)->size() > 1) *group = std::make_unique<HostStagedCommunicator>(std::move(*group), backend);
}

ParallelState make_parallel_state(const GridLayout& layout, Backend& backend, const std::string& communicator) {
  ParallelState state = mpi_parallel_state(layout);
  use_device_communicators(state, backend, communicator);
  return state;
}

}  // namespace gpt
