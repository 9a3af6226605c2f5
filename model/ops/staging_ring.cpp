// The staging ring's slot order, waits and growth (see staging_ring.h).
#include "model/ops/staging_ring.h"

#include <stdexcept>
#include <string>

namespace gpt {

StagingRing::StagingRing(int slots, Hooks hooks) : hooks_(std::move(hooks)) {
  if (slots < 1) throw std::invalid_argument("staging ring: needs at least 1 slot, got " + std::to_string(slots));
  if (!hooks_.alloc || !hooks_.free || !hooks_.wait) throw std::invalid_argument("staging ring: every hook is required");
  buffers_.resize(static_cast<size_t>(slots));
}

StagingRing::~StagingRing() {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    Buffer& b = buffers_[i];
    try {
      if (b.used) hooks_.wait(static_cast<int>(i));
    } catch (...) {
      // The device failed; its error was reported where it happened. The buffer is freed all the same.
    }
    if (b.ptr) hooks_.free(b.ptr);
  }
}

StagingRing::Slot StagingRing::acquire(size_t bytes) {
  const int index = next_;
  next_ = (next_ + 1) % slots();
  Buffer& b = buffers_[static_cast<size_t>(index)];
  if (b.used) {
    hooks_.wait(index);
    ++waits_;
    b.used = false;
  }
  if (b.bytes < bytes || !b.ptr) {
    void* grown = hooks_.alloc(bytes);  // may throw; the old buffer stays valid until it is replaced
    if (b.ptr) hooks_.free(b.ptr);
    b.ptr = grown;
    b.bytes = bytes;
    ++grows_;
  }
  b.used = true;
  return {index, b.ptr};
}

}  // namespace gpt
