// A flat op's segment table on the device (Backend::adamw_step_flat, sum_squares_segments): every segment
// is cut into tiles of kFlatTileElems elements, one thread block per tile, so a single launch covers a
// whole flat buffer with equal work per block and no block straddles two segments (each knows its
// segment's weight decay and norm slot). The table, a few dozen bytes per parameter, is copied to the
// device once, on its first use (CudaBackend::cached_device_copy): a step's tables are the same every step.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace gpt::cuda {

constexpr int kFlatThreads = 256;
constexpr int64_t kFlatTileElems = 4096;

struct DeviceSegment {
  int64_t begin, end;  // element range
  int64_t first_tile;  // index of the segment's first tile (the tiles of all segments are numbered in order)
  float weight_decay;
  int32_t norm_slot;
};

// The device copy of a table and its tile count.
struct DeviceSegmentTable {
  const DeviceSegment* segments = nullptr;
  int count = 0;
  int64_t tiles = 0;
};

// The segment that tile `tile` lies in: the last segment whose first tile is at or before it.
__device__ inline const DeviceSegment& segment_of_tile(const DeviceSegment* segments, int count, int64_t tile) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (segments[mid].first_tile <= tile) lo = mid; else hi = mid - 1;
  }
  return segments[lo];
}

}  // namespace gpt::cuda
