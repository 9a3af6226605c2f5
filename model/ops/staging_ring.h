// A ring of host staging buffers for asynchronous host-to-device uploads (the CUDA backend's token and
// target uploads, from page-locked memory). Each upload takes the next slot in turn, waits until that
// slot's previous copy has finished (by then normally long done: the ring holds several microbatches'
// uploads), grows the slot's buffer when the upload is larger, and the caller then fills it, queues the
// copy and marks its completion. The buffers and completion markers are the caller's (cudaMallocHost and
// CUDA events on the CUDA backend), passed in as hooks, so the ring's order and reuse rules run, and are
// tested, on the CPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace gpt {

class StagingRing {
 public:
  struct Hooks {
    std::function<void*(size_t bytes)> alloc;  // a host buffer of at least `bytes`; throws on failure
    std::function<void(void*)> free;
    std::function<void(int slot)> wait;        // until the copy last queued from `slot` has finished
  };
  struct Slot {
    int index = 0;
    void* buffer = nullptr;  // at least the acquired bytes
  };

  // slots >= 1; throws std::invalid_argument otherwise.
  StagingRing(int slots, Hooks hooks);
  // Waits for every slot's last copy, then frees the buffers.
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // The next slot, its previous copy finished, with room for `bytes`. The caller fills it, queues its
  // copy and marks the copy's completion (Hooks::wait for this slot must then wait for that mark).
  Slot acquire(size_t bytes);

  int slots() const { return static_cast<int>(buffers_.size()); }
  int64_t waits() const { return waits_; }  // acquisitions that had a previous copy to wait for
  int64_t grows() const { return grows_; }  // buffers (re)allocated

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
    bool used = false;  // a copy was queued from it since its last wait
  };
  Hooks hooks_;
  std::vector<Buffer> buffers_;
  int next_ = 0;
  int64_t waits_ = 0, grows_ = 0;
};

}  // namespace gpt
