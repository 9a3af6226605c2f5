// A communicator for device tensors over MPI through host memory (parallel.communicator: mpi): each call
// copies the device tensor into a host tensor of the same dtype, runs the wrapped MPI communicator's op on
// it and copies the result back. NCCL refuses two ranks on one GPU; this runs any layout's ranks on one
// device (slowly: every transfer crosses PCIe twice), which is how the multi-rank layout tests run on a
// single GPU. The values and the reduction order are the MPI communicator's, so a staged run reduces
// exactly as a CPU run of the same layout does. With a host backend it is the same code over host memory,
// which is how it is tested without a GPU.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/communicator.h"
#include "model/ops/backend.h"

namespace gpt {

class HostStagedCommunicator final : public Communicator {
 public:
  // `host`: an MPI communicator of the group; `device`: the backend whose tensors this group moves.
  HostStagedCommunicator(std::unique_ptr<Communicator> host, Backend& device);
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name(); }

  void all_reduce(Tensor& t, ReduceOp op) override;
  void all_reduce_host(double* data, int64_t count, ReduceOp op) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void send(const Tensor& t, int peer, int tag) override;
  void recv(Tensor& t, int peer, int tag) override;
  std::unique_ptr<PendingSend> send_async(const Tensor& t, int peer, int tag) override;
  void barrier() override;
  std::unique_ptr<PendingSend> all_reduce_async(Tensor& t, ReduceOp op) override;
  std::unique_ptr<PendingSend> reduce_scatter_blocks_async(Tensor& t, const std::vector<int64_t>& counts) override;

 private:
  // A host copy of `t` (same shape and dtype), or an uninitialised one.
  Tensor stage(const Tensor& t);
  Tensor host_like(const Tensor& t);
  // Writes the host tensor's values into the device tensor.
  void unstage(const Tensor& host, Tensor& t);
  // The wrapped communicator's byte and time counters, as this one's.
  void sync_counters();
  std::unique_ptr<Communicator> host_;
  Backend& device_;
  std::unique_ptr<Backend> host_backend_;
};

}  // namespace gpt
