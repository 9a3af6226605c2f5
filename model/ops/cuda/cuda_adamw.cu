// Optimizer kernels of the CUDA backend: AdamW on fp32 master weights and moments, of one tensor
// (adamw_step) or of a flat buffer's segments in one launch (adamw_step_flat, with the gradient scaling
// and the rounded store into the compute-dtype weights fused in), and the per-parameter fp64 sums of
// squares of a flat gradient buffer behind the global norm (sum_squares_segments: one partial per tile,
// then the partials of each segment added in order by one thread, so the sums are reproducible). The
// per-element update is ops::adamw_update, the CPU loops' own (model/ops/adamw_update.h).
#include <algorithm>
#include <vector>

#include "model/ops/adamw_update.h"
#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_flat_segments.cuh"
#include "model/ops/cuda/cuda_half.cuh"
#include "model/ops/cuda/cuda_reduce.cuh"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kThreads = 256;

// AdamW on fp32 w, g, m, v (see Backend::adamw_step); inv_bc1/2 = 1 / (1 - beta^step).
__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, float lr, float beta1, float beta2,
                             float eps, float weight_decay, float inv_bc1, float inv_bc2, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    ops::adamw_update(w[i], g[i], m[i], v[i], lr, beta1, beta2, eps, weight_decay, inv_bc1, inv_bc2);
}

// AdamW over one tile of a segment per block: g = grad * grad_scale, the segment's weight decay; the
// updated weight also goes to `value` (dtype vd) when value is not null. Grid: the table's tiles.
__global__ void adamw_flat_kernel(float* w, const float* grad, float* m, float* v, void* value, DType vd,
                                  const DeviceSegment* segments, int count, ops::AdamWHyper h, float inv_bc1,
                                  float inv_bc2) {
  const int64_t tile = blockIdx.x;
  const DeviceSegment& s = segment_of_tile(segments, count, tile);
  const int64_t lo = s.begin + (tile - s.first_tile) * kFlatTileElems;
  const int64_t hi = min(s.end, lo + kFlatTileElems);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float g = grad[i] * h.grad_scale;
    ops::adamw_update(w[i], g, m[i], v[i], h.lr, h.beta1, h.beta2, h.eps, s.weight_decay, inv_bc1, inv_bc2);
    if (value) store_from_f32(value, vd, i, w[i]);
  }
}

// partial[tile] = sum of x[i]^2 over the block's tile, in fp64. Grid: the table's tiles.
__global__ void tile_squares_kernel(const float* x, const DeviceSegment* segments, int count, double* partial) {
  const int64_t tile = blockIdx.x;
  const DeviceSegment& s = segment_of_tile(segments, count, tile);
  const int64_t lo = s.begin + (tile - s.first_tile) * kFlatTileElems;
  const int64_t hi = min(s.end, lo + kFlatTileElems);
  double acc = 0.0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const double e = x[i];
    acc += e * e;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[tile] = acc;
}

// sums[slot of segment k] += its tiles' partials, in tile order. One thread per segment.
__global__ void segment_squares_kernel(const double* partial, const DeviceSegment* segments, int count,
                                       int64_t tiles, double* sums) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= count) return;
  const int64_t end_tile = k + 1 < count ? segments[k + 1].first_tile : tiles;
  double total = 0.0;
  for (int64_t t = segments[k].first_tile; t < end_tile; ++t) total += partial[t];
  sums[segments[k].norm_slot] += total;
}

}  // namespace

namespace cuda {

// Tiles the segments for which keep(segment) holds; the device copy of the table is made once.
template <class Keep>
DeviceSegmentTable upload_segments(CudaBackend& be, const std::vector<ops::FlatSegment>& segments, Keep keep,
                                   const char* op) {
  std::vector<DeviceSegment> host;
  int64_t tiles = 0;
  for (const ops::FlatSegment& s : segments) {
    if (s.end <= s.begin || !keep(s)) continue;
    host.push_back({s.begin, s.end, tiles, s.weight_decay, s.norm_slot});
    tiles += (s.end - s.begin + kFlatTileElems - 1) / kFlatTileElems;
  }
  require(tiles < (int64_t(1) << 31), op, "too many tiles (" + std::to_string(tiles) + ")");
  DeviceSegmentTable t;
  t.count = static_cast<int>(host.size());
  t.tiles = tiles;
  if (host.empty()) return t;
  t.segments = static_cast<const DeviceSegment*>(be.cached_device_copy(host.data(), host.size() * sizeof(DeviceSegment), op));
  return t;
}

}  // namespace cuda

void CudaBackend::adamw_step(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                             float eps, float weight_decay, int64_t step) {
  const ops::AdamWBiasCorrections bc = ops::check_adamw(kChecks, w, g, m, v, beta1, beta2, step, "adamw_step");
  const int64_t n = w.numel();
  if (n == 0) return;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_>>>(w.f32(), g.f32(), m.f32(), v.f32(), lr, beta1, beta2,
                                                                eps, weight_decay, bc.inv_bc1, bc.inv_bc2, n);
  check_launch("adamw_step");
}

void CudaBackend::adamw_step_flat(Tensor& master, const Tensor& grad, Tensor& m, Tensor& v, Tensor* value,
                                  const std::vector<ops::FlatSegment>& segments, const ops::AdamWHyper& h) {
  const char* op = "adamw_step_flat";
  const ops::AdamWBiasCorrections bc = ops::check_adamw_flat(kChecks, master, grad, m, v, value, segments, h, op);
  const DeviceSegmentTable table = upload_segments(*this, segments, [](const ops::FlatSegment&) { return true; }, op);
  if (table.tiles == 0) return;
  adamw_flat_kernel<<<static_cast<unsigned>(table.tiles), kFlatThreads, 0, stream_>>>(
      master.f32(), grad.f32(), m.f32(), v.f32(), value ? value->raw() : nullptr,
      value ? value->dtype() : DType::F32, table.segments, table.count, h, bc.inv_bc1, bc.inv_bc2);
  check_launch(op);
}

void CudaBackend::sum_squares_segments(const Tensor& flat, const std::vector<ops::FlatSegment>& segments,
                                       Tensor& sums) {
  const char* op = "sum_squares_segments";
  require_dtype(flat, DType::F32, op, "flat");
  require_dtype(sums, DType::F64, op, "sums");
  ops::check_flat_segments(kChecks, segments, flat.numel(), sums.numel(), op);
  const DeviceSegmentTable table =
      upload_segments(*this, segments, [](const ops::FlatSegment& s) { return s.norm_slot >= 0; }, op);
  if (table.tiles == 0) return;
  Tensor partial = empty({table.tiles}, DType::F64);
  tile_squares_kernel<<<static_cast<unsigned>(table.tiles), kFlatThreads, 0, stream_>>>(
      flat.f32(), table.segments, table.count, partial.data<double>());
  check_launch(op);
  segment_squares_kernel<<<(table.count + kThreads - 1) / kThreads, kThreads, 0, stream_>>>(
      partial.data<double>(), table.segments, table.count, table.tiles, sums.data<double>());
  check_launch(op);
}

}  // namespace gpt
