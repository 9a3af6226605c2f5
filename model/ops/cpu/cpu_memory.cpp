// Host memory for CpuBackend: 64-byte aligned allocations (a cache line, and the widest vector load) with
// process-wide atomic counters of bytes in use and their high-water mark, plus fill, dtype-converting
// copy and the host upload/download entry points. The counters are global rather than per backend
// object because Storage's deleter is a plain function pointer that must find them without a `this`.
//
// Large blocks are recycled rather than handed back to the OS. glibc serves requests above its mmap
// threshold (32 MB at most) with fresh mappings and unmaps them on free, so a training step that allocates
// the same activation, logit and gradient buffers every iteration would page-fault on every page of them
// again and have the kernel zero it (a fifth of the step time at hidden 384, vocab 50304). Freed blocks of
// kPoolMinBytes and more go to a pool keyed by page-rounded size and serve the next request of that size
// (steps repeat their shapes, so after the first step nearly every request is served from it). The pool
// never holds more bytes than the most the live tensors needed at once, releasing the blocks idle longest
// first; in a steady training loop it stays below that, since at the step's peak it is nearly empty.
// The kernels' dtype-conversion buffers (ScratchBuffer) come from the same pool for the same reason; they
// count as live for the pool's bound but not in the tensor counters that the memory model predicts.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "model/ops/cpu/cpu_backend.h"
#include "model/ops/cpu/cpu_tensor_access.h"
#include "model/ops/half.h"

namespace gpt {

using namespace cpu;

namespace {

constexpr size_t kAlignment = 64;

std::atomic<size_t> g_bytes_in_use{0};
std::atomic<size_t> g_bytes_peak{0};
std::atomic<size_t> g_scratch_in_use{0};  // kernels' conversion buffers (ScratchBuffer): pooled, not counted
std::atomic<size_t> g_scratch_peak{0};

void raise_peak(std::atomic<size_t>& peak, size_t now) {
  size_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

// The recycled-block pool described at the top of the file. Never destroyed, so tensors that outlive static
// destruction can still be freed.
class BlockPool {
 public:
  static constexpr size_t kPoolMinBytes = size_t(256) << 10;
  static constexpr size_t kPage = 4096;

  static size_t block_size(size_t bytes) {
    return bytes >= kPoolMinBytes ? (bytes + kPage - 1) / kPage * kPage
                                  : std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  }

  // A block of block_size(bytes); `live` is the live byte count before this allocation.
  void* take(size_t bytes, size_t live) {
    const size_t size = block_size(bytes);
    if (size < kPoolMinBytes) return std::aligned_alloc(kAlignment, size);
    std::lock_guard<std::mutex> lock(mutex_);
    max_live_ = std::max(max_live_, live + size);
    auto hit = by_size_.find(size);
    if (hit == by_size_.end()) {
      void* fresh = std::aligned_alloc(kAlignment, size);
      if (!fresh && pooled_ > 0) {  // out of memory: pooled blocks are the first thing to give up
        release_while([] { return true; });
        fresh = std::aligned_alloc(kAlignment, size);
      }
      return fresh;
    }
    void* ptr = hit->second.ptr;
    by_age_.erase(hit->second.age);
    by_size_.erase(hit);
    pooled_ -= size;
    return ptr;
  }

  void give(void* ptr, size_t bytes) {
    const size_t size = block_size(bytes);
    if (size < kPoolMinBytes) return std::free(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t age = next_age_++;
    by_size_.emplace(size, Entry{ptr, age});
    by_age_.emplace(age, size);
    pooled_ += size;
    // The pool holds at most as many bytes as the live tensors ever needed at once; beyond that the
    // blocks idle longest go back to the OS (shapes the current work no longer asks for).
    release_while([this] { return pooled_ > max_live_; });
  }

 private:
  // Frees pooled blocks, the one pooled longest ago first, while `more()` holds and the pool is not empty.
  template <class More>
  void release_while(More more) {
    while (!by_age_.empty() && more()) {
      auto oldest = by_age_.begin();
      auto [first, last] = by_size_.equal_range(oldest->second);
      auto entry = std::find_if(first, last, [&](const auto& e) { return e.second.age == oldest->first; });
      std::free(entry->second.ptr);
      pooled_ -= oldest->second;
      by_size_.erase(entry);
      by_age_.erase(oldest);
    }
  }

  struct Entry {
    void* ptr;
    uint64_t age;  // when it was pooled
  };
  std::mutex mutex_;
  std::multimap<size_t, Entry> by_size_;  // block size -> pooled block
  std::map<uint64_t, size_t> by_age_;     // when pooled -> block size
  uint64_t next_age_ = 0;
  size_t pooled_ = 0;    // bytes in the pool
  size_t max_live_ = 0;  // most live bytes seen at an allocation of a pool-sized block
};

BlockPool& block_pool() {
  static BlockPool* pool = new BlockPool;
  return *pool;
}

void release_block(void* ptr, size_t bytes) {
  block_pool().give(ptr, bytes);
  g_bytes_in_use.fetch_sub(bytes, std::memory_order_relaxed);
}

size_t live_bytes() { return g_bytes_in_use.load(std::memory_order_relaxed) + g_scratch_in_use.load(std::memory_order_relaxed); }

}  // namespace

Tensor CpuBackend::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) require(d >= 0, "empty", "negative dimension in shape " + shape_str(shape));
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  // Block sizes are multiples of the alignment (aligned_alloc needs that); empty tensors still get a real
  // (unused) block.
  void* ptr = block_pool().take(bytes, live_bytes());
  if (!ptr) {
    throw std::runtime_error("CpuBackend::empty: out of host memory allocating " + std::to_string(bytes) +
                             " bytes for " + shape_str(shape) + " " + dtype_name(dtype) + " (" +
                             std::to_string(g_bytes_in_use.load()) + " bytes already in use)");
  }
  auto storage = std::make_shared<Storage>();
  storage->ptr = ptr;
  storage->bytes = bytes;
  storage->device = Device::CPU;
  storage->deleter = &release_block;
  raise_peak(g_bytes_peak, g_bytes_in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  return Tensor(std::move(storage), 0, shape, dtype);
}

namespace cpu {

ScratchBuffer::ScratchBuffer(size_t bytes) : bytes_(bytes) {
  ptr_ = block_pool().take(bytes, live_bytes());
  if (!ptr_) throw std::runtime_error("CpuBackend: out of host memory allocating a " + std::to_string(bytes) +
                                      "-byte conversion buffer");
  raise_peak(g_scratch_peak, g_scratch_in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

size_t scratch_bytes_in_use() { return g_scratch_in_use.load(std::memory_order_relaxed); }
size_t scratch_bytes_peak() { return g_scratch_peak.load(std::memory_order_relaxed); }
void reset_scratch_peak() { g_scratch_peak.store(scratch_bytes_in_use(), std::memory_order_relaxed); }

ScratchBuffer::~ScratchBuffer() {
  if (!ptr_) return;
  block_pool().give(ptr_, bytes_);
  g_scratch_in_use.fetch_sub(bytes_, std::memory_order_relaxed);
}

}  // namespace cpu

size_t CpuBackend::memory_in_use() const { return g_bytes_in_use.load(std::memory_order_relaxed); }
size_t CpuBackend::memory_peak() const { return g_bytes_peak.load(std::memory_order_relaxed); }
void CpuBackend::reset_memory_peak() { g_bytes_peak.store(g_bytes_in_use.load(std::memory_order_relaxed)); }

void CpuBackend::fill(Tensor& t, float value) {
  require(t.defined() && t.device() == Device::CPU, "fill", "tensor must be a defined host tensor");
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::F32: {
      float* p = t.f32();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      return;
    }
    case DType::BF16:
    case DType::F16: {
      const uint16_t bits = t.dtype() == DType::BF16 ? fp32_to_bf16(value) : fp32_to_fp16(value);
      uint16_t* p = t.data<uint16_t>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) p[i] = bits;
      return;
    }
    case DType::I32: {
      require(std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 2147483648.0f, "fill",
              "cannot fill an int32 tensor with non-integer value " + std::to_string(value));
      const int32_t v = static_cast<int32_t>(value);
      int32_t* p = t.i32();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case DType::F64: {
      double* p = t.data<double>();
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      return;
    }
  }
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  require(src.defined() && dst.defined(), "copy", "source and destination must be defined tensors");
  require(src.device() == Device::CPU && dst.device() == Device::CPU, "copy", "tensors must live in host memory");
  require(src.numel() == dst.numel(), "copy",
          "element counts differ: source " + describe(src) + ", destination " + describe(dst));
  if (src.dtype() == dst.dtype()) {
    if (src.raw() != dst.raw()) parallel_memcpy(dst.raw(), src.raw(), src.bytes());
    return;
  }
  require(is_float(src.dtype()) && is_float(dst.dtype()), "copy",
          "cannot convert between " + describe(src) + " and " + describe(dst) + " (only float dtypes convert)");
  if (src.dtype() == DType::F32) {
    from_f32(src.f32(), dst.raw(), dst.dtype(), dst.numel());
  } else if (dst.dtype() == DType::F32) {
    to_f32(src.raw(), src.dtype(), dst.f32(), dst.numel());
  } else {
    // bf16 <-> fp16 goes through fp32, which holds both exactly, so only the final rounding happens.
    F32Input staged(src, "copy", "src");
    from_f32(staged.get(), dst.raw(), dst.dtype(), dst.numel());
  }
}

void CpuBackend::upload(const float* host, Tensor& dst) {
  require_float(dst, "upload", "dst");
  from_f32(host, dst.raw(), dst.dtype(), dst.numel());
}

void CpuBackend::download(const Tensor& src, float* host) {
  require_float(src, "download", "src");
  to_f32(src.raw(), src.dtype(), host, src.numel());
}

void CpuBackend::upload_i32(const int32_t* host, Tensor& dst) {
  require_dtype(dst, DType::I32, "upload_i32", "dst");
  parallel_memcpy(dst.raw(), host, dst.bytes());
}

void CpuBackend::download_i32(const Tensor& src, int32_t* host) {
  require_dtype(src, DType::I32, "download_i32", "src");
  parallel_memcpy(host, src.raw(), src.bytes());
}

void CpuBackend::download_f64(const Tensor& src, double* host) {
  require_dtype(src, DType::F64, "download_f64", "src");
  std::memcpy(host, src.raw(), src.bytes());
}

}  // namespace gpt
