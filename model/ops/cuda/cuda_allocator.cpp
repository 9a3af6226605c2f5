// Caching device allocator (see cuda_allocator.h): size rounding, best-fit reuse from the free list,
// out-of-memory retry after returning the cache to the driver, and the byte counters behind
// Backend::memory_in_use / memory_peak.
#include "model/ops/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace gpt::cuda {

namespace {
constexpr size_t kSmallLimit = size_t(1) << 20;  // below this, round to kSmallRound
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t(2) << 20;

std::string mib(size_t bytes) { return std::to_string(bytes / (1024.0 * 1024.0)) + " MiB"; }
}  // namespace

CachingAllocator& CachingAllocator::instance() {
  static CachingAllocator* allocator = new CachingAllocator();  // never destroyed, see the header
  return *allocator;
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) return kSmallRound;  // empty tensors still get a real block
  if (bytes < kSmallLimit) return (bytes + kSmallRound - 1) / kSmallRound * kSmallRound;
  return (bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void* CachingAllocator::allocate(size_t bytes, const char* what) {
  const size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* ptr = nullptr;
  size_t got = size;
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && it->first <= size + size / 4) {
    ptr = it->second;
    got = it->first;
    cached_bytes_ -= got;
    cached_.erase(it);
  } else {
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error before retrying
      free_cached_locked();
      err = cudaMalloc(&ptr, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw std::runtime_error(std::string("CudaBackend::empty: cannot allocate ") + mib(size) + " for " + what +
                               ": " + cudaGetErrorString(err) + " (backend holds " + mib(in_use_) +
                               " in use; device has " + mib(free_b) + " free of " + mib(total_b) + ")");
    }
    ++mallocs_;
  }
  live_.emplace(ptr, got);
  in_use_ += got;
  if (in_use_ > peak_) peak_ = in_use_;
  return ptr;
}

void CachingAllocator::release(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours: nothing sensible to do in a deleter
  in_use_ -= it->second;
  cached_bytes_ += it->second;
  cached_.emplace(it->second, ptr);
  live_.erase(it);
}

void CachingAllocator::free_cached_locked() {
  // A cached block may still be read by a kernel queued before it was released: let the device finish.
  cudaDeviceSynchronize();
  for (auto& [size, ptr] : cached_) cudaFree(ptr);
  cached_.clear();
  cached_bytes_ = 0;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  free_cached_locked();
}

size_t CachingAllocator::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

size_t CachingAllocator::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

size_t CachingAllocator::reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_ + cached_bytes_;
}

int64_t CachingAllocator::device_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mallocs_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

}  // namespace gpt::cuda
