// The staging ring behind the CUDA backend's pinned token uploads (model/ops/staging_ring.h), with
// recording hooks in place of page-locked buffers and CUDA events: slots are taken in turn, a slot's
// previous copy is waited for before the slot is reused and never otherwise, a buffer grows only when an
// upload outgrows it (and the data staged in the others is untouched), a failed allocation leaves the ring
// usable, and destruction waits for every slot with a queued copy before freeing the buffers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/ops/staging_ring.h"

using namespace gpt;

namespace {

struct Recorder {
  std::vector<std::string> events;
  std::map<void*, size_t> live;  // buffer -> bytes
  bool fail_next_alloc = false;
  StagingRing::Hooks hooks() {
    return {[this](size_t bytes) -> void* {
              if (fail_next_alloc) {
                fail_next_alloc = false;
                throw std::runtime_error("out of pinned memory");
              }
              void* p = std::malloc(bytes);
              live[p] = bytes;
              events.push_back("alloc " + std::to_string(bytes));
              return p;
            },
            [this](void* p) {
              events.push_back("free " + std::to_string(live.at(p)));
              live.erase(p);
              std::free(p);
            },
            [this](int slot) { events.push_back("wait " + std::to_string(slot)); }};
  }
};

}  // namespace

TEST(StagingRing, SlotsInTurnWaitOnlyOnReuse) {
  Recorder r;
  {
    StagingRing ring(3, r.hooks());
    std::vector<int> order;
    for (int i = 0; i < 7; ++i) order.push_back(ring.acquire(64).index);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 0, 1, 2, 0}));
    // Three first uses allocate, four reuses wait for the copy queued from that slot before.
    EXPECT_EQ(ring.grows(), 3);
    EXPECT_EQ(ring.waits(), 4);
    EXPECT_EQ(r.events, (std::vector<std::string>{"alloc 64", "alloc 64", "alloc 64", "wait 0", "wait 1", "wait 2",
                                                  "wait 0"}));
    r.events.clear();
  }
  // Destruction waits for each slot with a queued copy, then frees its buffer.
  EXPECT_EQ(r.events, (std::vector<std::string>{"wait 0", "free 64", "wait 1", "free 64", "wait 2", "free 64"}));
  EXPECT_TRUE(r.live.empty());
}

TEST(StagingRing, BuffersGrowOnlyWhenOutgrownAndKeepOtherSlots) {
  Recorder r;
  StagingRing ring(2, r.hooks());
  StagingRing::Slot a = ring.acquire(16);
  std::memset(a.buffer, 0xAB, 16);
  StagingRing::Slot b = ring.acquire(100);
  ASSERT_NE(a.buffer, b.buffer);
  StagingRing::Slot a2 = ring.acquire(8);  // slot 0 again: big enough, the same buffer
  EXPECT_EQ(a2.index, 0);
  EXPECT_EQ(a2.buffer, a.buffer);
  EXPECT_EQ(static_cast<unsigned char*>(a2.buffer)[15], 0xAB);  // the ring never writes into a buffer
  StagingRing::Slot b2 = ring.acquire(200);                    // slot 1 outgrown: replaced
  EXPECT_EQ(b2.index, 1);
  EXPECT_EQ(r.live.at(b2.buffer), 200u);
  EXPECT_EQ(ring.grows(), 3);
  EXPECT_EQ(r.live.size(), 2u);
}

TEST(StagingRing, FailedGrowthLeavesTheRingUsable) {
  Recorder r;
  StagingRing ring(1, r.hooks());
  void* first = ring.acquire(32).buffer;
  r.fail_next_alloc = true;
  EXPECT_THROW(ring.acquire(4096), std::runtime_error);
  EXPECT_EQ(r.live.count(first), 1u);  // the old buffer is still there
  StagingRing::Slot again = ring.acquire(32);
  EXPECT_EQ(again.buffer, first);
  EXPECT_EQ(ring.acquire(4096).index, 0);
}

TEST(StagingRing, BadArgumentsAreErrors) {
  Recorder r;
  EXPECT_THROW(StagingRing(0, r.hooks()), std::invalid_argument);
  StagingRing::Hooks missing = r.hooks();
  missing.wait = nullptr;
  EXPECT_THROW(StagingRing(2, missing), std::invalid_argument);
}
