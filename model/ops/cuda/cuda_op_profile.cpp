// The per-op GPU time profile behind GPT_CUDA_PROFILE (cuda_op_profile.h).
#include "model/ops/cuda/cuda_op_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpt::cuda {

namespace {

OpProfile*& instance() {
  static OpProfile* profile = nullptr;
  return profile;
}

// Prefix of the row for an interval that began before the host waited for the stream: the host's own
// work after the wait (the gradient norm's all-reduce, logging, the next step's data) plus the op's.
const std::string kAfterWait = "(after a host wait) ";

bool wanted() {
  const char* v = std::getenv("GPT_CUDA_PROFILE");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

OpProfile* OpProfile::active() { return instance(); }

void OpProfile::start(cudaStream_t stream) {
  if (instance() != nullptr || !wanted()) return;
  instance() = new OpProfile(stream);  // lives to the end of the process, like the device context
}

cudaEvent_t OpProfile::take() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
  return e;
}

void OpProfile::mark(const std::string& op) {
  if (failed_) return;
  cudaEvent_t e = take();
  if (e == nullptr || cudaEventRecord(e, stream_) != cudaSuccess) {
    failed_ = true;  // the profile stops; the run goes on
    return;
  }
  open_.emplace_back(e, after_idle_ ? kAfterWait + op : op);
  after_idle_ = false;
}

void OpProfile::collect(bool stream_idle) {
  size_t done = 0;
  for (; done < open_.size(); ++done) {
    auto& [e, op] = open_[done];
    if (cudaEventQuery(e) != cudaSuccess) break;  // not finished (or failed): later
    if (last_ != nullptr) {
      float ms = 0.f;
      if (cudaEventElapsedTime(&ms, last_, e) == cudaSuccess) {
        auto& [total, calls] = totals_[op];
        total += ms;
        ++calls;
        unreported_ = true;
      }
      free_.push_back(last_);
    }
    last_ = e;
  }
  open_.erase(open_.begin(), open_.begin() + static_cast<std::ptrdiff_t>(done));
  if (stream_idle && open_.empty() && last_ != nullptr) after_idle_ = true;
}

std::string OpProfile::table() const {
  std::vector<std::pair<std::string, std::pair<double, long long>>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double all = 0;
  for (const auto& r : rows) all += r.second.first;
  std::string out = "GPU time by op (GPT_CUDA_PROFILE; gaps within a step charged to the op after them):\n";
  char line[160];
  std::snprintf(line, sizeof line, "%-36s %12s %10s %7s\n", "op", "ms", "calls", "share");
  out += line;
  for (const auto& [op, t] : rows) {
    std::snprintf(line, sizeof line, "%-36s %12.2f %10lld %6.1f%%\n", op.c_str(), t.first, t.second,
                  all > 0 ? 100.0 * t.first / all : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-36s %12.2f\n", "total", all);
  out += line;
  return out;
}

}  // namespace gpt::cuda
