// GPT_CUDA_PROFILE=1: where a run's GPU time goes, op by op. After each op enqueues work on the compute
// stream (a kernel launch, a cuBLAS/cuBLASLt product, cuDNN's attention), a CUDA event is recorded there;
// the time between two consecutive events is charged to the later op. When the host has waited for the
// stream (once per step) the finished events are read and recycled. When a backend is destroyed it logs a
// table of the ops by total time, with calls and shares (once for what it adds: a later backend's table
// repeats nothing unless it ran more). The compute stream runs its work in order, so the shares add up to
// the stream's busy time plus its idle gaps. A gap while the host keeps the stream fed (the host late in
// enqueuing, or the stream waiting for a communication stream) is charged to the op after it; the first
// op after the host has waited for the stream (a download: once per step, before the gradient norm's
// all-reduce and the optimizer) gets a row of its own, "(after a host wait) <op>", since its interval
// holds the host's work too. Off by default: it costs an event record per op.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gpt::cuda {

class OpProfile {
 public:
  // The process's profile when GPT_CUDA_PROFILE is set and a backend has started it, else null.
  static OpProfile* active();
  // Starts the profile on `stream` (the first backend's compute stream); later calls do nothing.
  static void start(cudaStream_t stream);

  void mark(const std::string& op);  // an event after `op`'s work on the stream
  // Reads the events that have completed; `stream_idle`: the host has just waited for the stream, so the
  // next mark's interval starts with host time.
  void collect(bool stream_idle);
  std::string table() const;  // the ops by total time
  bool has_unreported() const { return unreported_; }
  std::string report() {  // the table, remembering that it was shown
    unreported_ = false;
    return table();
  }

 private:
  explicit OpProfile(cudaStream_t stream) : stream_(stream) {}
  cudaEvent_t take();

  cudaStream_t stream_;
  cudaEvent_t last_ = nullptr;                              // the latest completed mark: the next interval's start
  std::vector<std::pair<cudaEvent_t, std::string>> open_;  // recorded, not yet read
  std::vector<cudaEvent_t> free_;
  std::map<std::string, std::pair<double, long long>> totals_;  // op -> (ms, calls)
  bool failed_ = false;
  bool after_idle_ = false;  // the next mark ends an interval that began before a host wait
  bool unreported_ = false;  // intervals read since the table was last shown
};

}  // namespace gpt::cuda
