// Host-staged collectives and p2p for device tensors (see parallel/comm/staged_communicator.h).
#include "parallel/comm/staged_communicator.h"

#include <functional>
#include <stdexcept>
#include <vector>

#include "model/ops/cpu/cpu_tensor_access.h"

namespace gpt {

namespace {

// A non-blocking host operation on a staged copy: keeps the copy alive and, for a reduction, writes the
// result back into the device tensor once the host operation is done.
class StagedPending final : public PendingSend {
 public:
  using Unstage = std::function<void()>;
  StagedPending(std::unique_ptr<PendingSend> inner, Unstage unstage)
      : unstage_(std::move(unstage)), inner_(std::move(inner)) {}
  ~StagedPending() override {
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    inner_->wait();
    if (unstage_) unstage_();
  }
  void progress() override {
    if (!done_) inner_->progress();
  }

 private:
  Unstage unstage_;  // holds the host copy: declared first, so it outlives the request in inner_
  std::unique_ptr<PendingSend> inner_;
  bool done_ = false;
};

}  // namespace

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> host, Backend& device)
    : host_(std::move(host)), device_(device), host_backend_(make_backend("cpu")) {}

Tensor HostStagedCommunicator::host_like(const Tensor& t) { return host_backend_->empty(t.shape(), t.dtype()); }

Tensor HostStagedCommunicator::stage(const Tensor& t) {
  Tensor h = host_like(t);
  if (t.dtype() == DType::I32) {
    device_.download_i32(t, static_cast<int32_t*>(h.raw()));
  } else if (t.dtype() == DType::F32) {
    device_.download(t, h.f32());
  } else {  // 16-bit: through fp32, exactly, back into the same dtype on the host
    std::vector<float> f(t.numel());
    device_.download(t, f.data());
    cpu::from_f32(f.data(), h.raw(), t.dtype(), t.numel());
  }
  return h;
}

void HostStagedCommunicator::unstage(const Tensor& h, Tensor& t) {
  if (t.dtype() == DType::I32) {
    device_.upload_i32(static_cast<const int32_t*>(h.raw()), t);
  } else if (t.dtype() == DType::F32) {
    device_.upload(h.f32(), t);
  } else {
    std::vector<float> f(t.numel());
    cpu::to_f32(h.raw(), t.dtype(), f.data(), t.numel());
    device_.upload(f.data(), t);
  }
}

void HostStagedCommunicator::sync_counters() {
  bytes_moved_ = host_->bytes_moved();
  seconds_spent_ = host_->seconds_spent();
}

void HostStagedCommunicator::all_reduce(Tensor& t, ReduceOp op) {
  Tensor h = stage(t);
  host_->all_reduce(h, op);
  unstage(h, t);
  sync_counters();
}

void HostStagedCommunicator::all_reduce_host(double* data, int64_t count, ReduceOp op) {
  host_->all_reduce_host(data, count, op);
  sync_counters();
}

void HostStagedCommunicator::all_gather(const Tensor& in, Tensor& out) {
  Tensor hin = stage(in), hout = host_like(out);
  host_->all_gather(hin, hout);
  unstage(hout, out);
  sync_counters();
}

void HostStagedCommunicator::reduce_scatter(const Tensor& in, Tensor& out) {
  Tensor hin = stage(in), hout = host_like(out);
  host_->reduce_scatter(hin, hout);
  unstage(hout, out);
  sync_counters();
}

void HostStagedCommunicator::broadcast(Tensor& t, int root) {
  Tensor h = rank() == root ? stage(t) : host_like(t);
  host_->broadcast(h, root);
  unstage(h, t);
  sync_counters();
}

void HostStagedCommunicator::send(const Tensor& t, int peer, int tag) {
  host_->send(stage(t), peer, tag);
  sync_counters();
}

void HostStagedCommunicator::recv(Tensor& t, int peer, int tag) {
  Tensor h = host_like(t);
  host_->recv(h, peer, tag);
  unstage(h, t);
  sync_counters();
}

std::unique_ptr<PendingSend> HostStagedCommunicator::send_async(const Tensor& t, int peer, int tag) {
  Tensor h = stage(t);
  auto inner = host_->send_async(h, peer, tag);
  sync_counters();
  return std::make_unique<StagedPending>(std::move(inner), [h] {});  // keeps the host copy alive
}

void HostStagedCommunicator::barrier() { host_->barrier(); }

std::unique_ptr<PendingSend> HostStagedCommunicator::all_reduce_async(Tensor& t, ReduceOp op) {
  Tensor h = stage(t);
  auto inner = host_->all_reduce_async(h, op);
  sync_counters();
  return std::make_unique<StagedPending>(std::move(inner), [this, h, t]() mutable { unstage(h, t); });
}

std::unique_ptr<PendingSend> HostStagedCommunicator::reduce_scatter_blocks_async(Tensor& t,
                                                                               const std::vector<int64_t>& counts) {
  Tensor h = stage(t);
  auto inner = host_->reduce_scatter_blocks_async(h, counts);
  sync_counters();
  return std::make_unique<StagedPending>(std::move(inner), [this, h, t]() mutable { unstage(h, t); });
}

}  // namespace gpt
