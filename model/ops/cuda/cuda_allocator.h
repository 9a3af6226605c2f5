// The CUDA backend's caching device allocator. cudaMalloc and cudaFree synchronise the device and cost
// tens of microseconds to milliseconds, so freed blocks are kept in a free list keyed by size and handed
// out again to later requests of (nearly) the same size; a training step that repeats the previous step's
// shapes is then served from the cache without touching the driver. Reuse is safe without events because
// every kernel runs on the backend's one compute stream, in order: a block freed on the host while a
// kernel still reads it can only be handed to work queued after that kernel. (Communication streams join
// the compute stream before any tensor they touch can be freed; see parallel/comm/nccl_communicator.h.)
// Sizes are rounded up to 512 bytes below 1 MiB and to 2 MiB above, and a cached block is reused for a
// request when it is at most a quarter larger. When cudaMalloc runs out of memory the cache is returned to
// the driver and the allocation retried once.
// One process-wide instance: Storage's deleter is a plain function pointer and may run after the backend
// object is gone, so the allocator is never destroyed (its blocks go back to the driver at process exit).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace gpt::cuda {

class CachingAllocator {
 public:
  static CachingAllocator& instance();

  // A block of at least `bytes` on the current device. Throws std::runtime_error when the device is out
  // of memory even after the cache was emptied; `what` describes the request for that message.
  void* allocate(size_t bytes, const char* what);
  // Returns a block from allocate() to the cache.
  void release(void* ptr);
  // Gives every cached block back to the driver (synchronises the device).
  void empty_cache();

  size_t in_use() const;      // bytes of blocks handed out
  size_t peak() const;        // high-water mark of in_use since start or reset_peak
  size_t reserved() const;    // in use + cached
  int64_t device_allocations() const;  // cudaMalloc calls so far
  void reset_peak();

  static size_t round_size(size_t bytes);

 private:
  CachingAllocator() = default;
  void free_cached_locked();

  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> live_;  // handed-out block -> its rounded size
  std::multimap<size_t, void*> cached_;      // rounded size -> free block
  size_t in_use_ = 0, peak_ = 0, cached_bytes_ = 0;
  int64_t mallocs_ = 0;
};

}  // namespace gpt::cuda
