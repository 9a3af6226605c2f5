// Memory ops of the CUDA backend: fill, dtype-converting copy, host upload/download and the cast kernel
// behind them. Casts round to nearest even exactly like model/ops/half.h (cuda_half.cuh), so a BF16/F16
// tensor holds the same bits whichever backend wrote it. Host transfers go through the compute stream;
// downloads wait for it and then raise any problem a kernel reported.
#include <cmath>
#include <cstring>

#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_half.cuh"
#include "model/ops/cuda/cuda_launch.h"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kThreads = 256;

// dst[i] = convert(src[i]) for float dtypes, i < n.
__global__ void cast_kernel(const void* src, DType sd, void* dst, DType dd, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_from_f32(dst, dd, i, load_as_f32(src, sd, i));
}

// p[i] = bits for i < n (one 16-, 32- or 64-bit pattern, so every dtype's fill is a plain store).
template <typename Word>
__global__ void fill_kernel(Word* p, Word bits, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = bits;
}

}  // namespace

namespace cuda {

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (src_dtype == dst_dtype) {
    if (src != dst) {
      check_cuda(cudaMemcpyAsync(dst, src, n * dtype_size(src_dtype), cudaMemcpyDeviceToDevice, stream), "copy",
                 "cudaMemcpyAsync");
      sync_check("copy", "cudaMemcpyAsync (waited for under GPT_CUDA_SYNC_CHECKS)", "memcpy");
    }
    return;
  }
  cast_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(src, src_dtype, dst, dst_dtype, n);
  check_launch("copy");
}

}  // namespace cuda

Tensor CudaBackend::as_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.shape(), dtype);
  cast(t.raw(), t.dtype(), out.raw(), dtype, t.numel(), stream_);
  return out;
}

void CudaBackend::fill(Tensor& t, float value) {
  require_device(t, "fill", "t");
  const int64_t n = t.numel();
  if (n == 0) return;
  if (value == 0.f && !std::signbit(value)) {  // all-zero bits are +0 in every dtype
    check_cuda(cudaMemsetAsync(t.raw(), 0, t.bytes(), stream_), "fill", "cudaMemsetAsync");
    sync_check("fill", "cudaMemsetAsync (waited for under GPT_CUDA_SYNC_CHECKS)", "memset");
    return;
  }
  const unsigned grid = grid_for(n, kThreads);
  switch (t.dtype()) {
    case DType::F32:
      fill_kernel<uint32_t><<<grid, kThreads, 0, stream_>>>(t.data<uint32_t>(), float_bits(value), n);
      break;
    case DType::BF16:
      fill_kernel<uint16_t><<<grid, kThreads, 0, stream_>>>(t.data<uint16_t>(), f32_to_bf16(value), n);
      break;
    case DType::F16:
      fill_kernel<uint16_t><<<grid, kThreads, 0, stream_>>>(t.data<uint16_t>(), f32_to_f16(value), n);
      break;
    case DType::I32: {
      require(std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 2147483648.0f, "fill",
              "cannot fill an int32 tensor with non-integer value " + std::to_string(value));
      const int32_t v = static_cast<int32_t>(value);
      fill_kernel<uint32_t><<<grid, kThreads, 0, stream_>>>(t.data<uint32_t>(), static_cast<uint32_t>(v), n);
      break;
    }
    case DType::F64: {
      const double d = value;
      uint64_t bits = 0;
      std::memcpy(&bits, &d, sizeof bits);
      fill_kernel<uint64_t><<<grid, kThreads, 0, stream_>>>(t.data<uint64_t>(), bits, n);
      break;
    }
  }
  check_launch("fill");
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  require_device(src, "copy", "src");
  require_device(dst, "copy", "dst");
  require(src.numel() == dst.numel(), "copy",
          "element counts differ: source " + describe(src) + ", destination " + describe(dst));
  require(src.dtype() == dst.dtype() || (is_float(src.dtype()) && is_float(dst.dtype())), "copy",
          "cannot convert between " + describe(src) + " and " + describe(dst) + " (only float dtypes convert)");
  cast(src.raw(), src.dtype(), dst.raw(), dst.dtype(), src.numel(), stream_);
}

void CudaBackend::upload(const float* host, Tensor& dst) {
  require_float(dst, "upload", "dst");
  const int64_t n = dst.numel();
  if (n == 0) return;
  // Pageable host memory is staged by the driver before cudaMemcpyAsync returns, so `host` may be
  // freed as soon as this returns.
  if (dst.dtype() == DType::F32) {
    check_cuda(cudaMemcpyAsync(dst.raw(), host, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "upload",
               "cudaMemcpyAsync");
    sync_check("upload", "cudaMemcpyAsync (waited for under GPT_CUDA_SYNC_CHECKS)", "memcpy");
    return;
  }
  Tensor staged = empty(dst.shape(), DType::F32);
  check_cuda(cudaMemcpyAsync(staged.raw(), host, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "upload",
             "cudaMemcpyAsync");
  sync_check("upload", "cudaMemcpyAsync (waited for under GPT_CUDA_SYNC_CHECKS)", "memcpy");
  cast(staged.raw(), DType::F32, dst.raw(), dst.dtype(), n, stream_);
}

void CudaBackend::download(const Tensor& src, float* host) {
  require_float(src, "download", "src");
  const int64_t n = src.numel();
  if (n > 0) {
    Tensor f32 = as_dtype(src, DType::F32);
    wait_for_stream("download");  // a copy into pageable memory blocks; poll for communication errors first
    check_cuda(cudaMemcpyAsync(host, f32.raw(), n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "download",
               "cudaMemcpyAsync");
  }
  synchronize();
}

void CudaBackend::upload_i32(const int32_t* host, Tensor& dst) {
  require_dtype(dst, DType::I32, "upload_i32", "dst");
  if (dst.numel() == 0) return;
  // From a page-locked staging slot: the copy is queued and this returns without waiting for the stream.
  const StagingRing::Slot slot = staging_->acquire(dst.bytes());
  std::memcpy(slot.buffer, host, dst.bytes());
  check_cuda(cudaMemcpyAsync(dst.raw(), slot.buffer, dst.bytes(), cudaMemcpyHostToDevice, stream_), "upload_i32",
             "cudaMemcpyAsync");
  check_cuda(cudaEventRecord(staging_events_[static_cast<size_t>(slot.index)], stream_), "upload_i32",
             "cudaEventRecord (staging slot)");
  sync_check("upload_i32", "cudaMemcpyAsync (waited for under GPT_CUDA_SYNC_CHECKS)", "memcpy");
}

void CudaBackend::download_i32(const Tensor& src, int32_t* host) {
  require_dtype(src, DType::I32, "download_i32", "src");
  wait_for_stream("download_i32");
  if (src.numel() > 0)
    check_cuda(cudaMemcpyAsync(host, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, stream_), "download_i32",
               "cudaMemcpyAsync");
  synchronize();
}

void CudaBackend::download_f64(const Tensor& src, double* host) {
  require_dtype(src, DType::F64, "download_f64", "src");
  wait_for_stream("download_f64");  // the step's one wait: polls for communication errors
  if (src.numel() > 0)
    check_cuda(cudaMemcpyAsync(host, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, stream_), "download_f64",
               "cudaMemcpyAsync");
  synchronize();
}

}  // namespace gpt
