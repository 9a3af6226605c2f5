// CudaBackend set-up: the device check behind `backend: cuda`, the per-device context (compute stream,
// cuBLAS handle and workspace, the cuBLASLt plan cache, the device-side error report), allocation through the caching allocator,
// synchronisation and the reporting of problems that kernels found in their inputs.
//
// The context is shared by every CudaBackend on the same device and never destroyed: the caching
// allocator's stream-order argument needs one stream per device for the whole process, and Storage
// deleters may run after the last backend object is gone.
#include "model/ops/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/ops/cuda/cuda_allocator.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_factory.h"

namespace gpt {

using namespace cuda;

namespace cuda {

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (unsupported shape, stride or dtype combination)";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

}  // namespace cuda

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // what cuBLAS recommends for Hopper

struct DeviceContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* workspace = nullptr;
  std::unique_ptr<LtMatmulCache> lt;  // borrows `workspace`: same stream, so uses are ordered
  DeviceErrorReport* error_device = nullptr;
};

DeviceContext& device_context(int device) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<DeviceContext>>* contexts = new std::vector<std::unique_ptr<DeviceContext>>();
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(contexts->size()) <= device) contexts->resize(device + 1);
  auto& slot = (*contexts)[device];
  if (slot) return *slot;
  auto ctx = std::make_unique<DeviceContext>();
  const char* op = "CudaBackend";
  check_cuda(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking), op, "cudaStreamCreate");
  check_cublas(cublasCreate(&ctx->cublas), op, "cublasCreate");
  check_cublas(cublasSetStream(ctx->cublas, ctx->stream), op, "cublasSetStream");
  // 16-bit outputs accumulate in fp32 all the way, also inside split-K reductions.
  check_cublas(cublasSetMathMode(ctx->cublas, static_cast<cublasMath_t>(
                                                  CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
               op, "cublasSetMathMode");
  ctx->workspace = CachingAllocator::instance().allocate(kCublasWorkspaceBytes, "the cuBLAS workspace");
  check_cublas(cublasSetWorkspace(ctx->cublas, ctx->workspace, kCublasWorkspaceBytes), op, "cublasSetWorkspace");
  ctx->lt = std::make_unique<LtMatmulCache>(ctx->workspace, kCublasWorkspaceBytes);
  ctx->error_device =
      static_cast<DeviceErrorReport*>(CachingAllocator::instance().allocate(sizeof(DeviceErrorReport), "the error report"));
  check_cuda(cudaMemsetAsync(ctx->error_device, 0, sizeof(DeviceErrorReport), ctx->stream), op, "cudaMemsetAsync");
  check_cuda(cudaStreamSynchronize(ctx->stream), op, "cudaStreamSynchronize");
  slot = std::move(ctx);
  return *slot;
}

void release_device_block(void* ptr, size_t) { CachingAllocator::instance().release(ptr); }

const char* op_name(int op) {
  switch (static_cast<CudaOp>(op)) {
    case CudaOp::CeSumExp: return "ce_sum_exp";
    case CudaOp::CeRowStats: return "ce_row_stats";
    case CudaOp::CeBackward: return "ce_backward";
    case CudaOp::EmbeddingForward: return "embedding_forward";
    case CudaOp::EmbeddingBackward: return "embedding_backward";
  }
  return "a kernel";
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int local_rank) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count <= 0) {
    cudaGetLastError();  // leave no sticky error behind for later calls
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::string why = err != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ", " +
                                               cudaGetErrorString(err)
                                         : std::string("cudaGetDeviceCount reports 0 devices");
    if (visible) why += std::string("; CUDA_VISIBLE_DEVICES=\"") + visible + "\"";
    throw std::runtime_error("backend cuda: no CUDA device is visible (" + why + ") on local rank " +
                             std::to_string(local_rank) + "; use a machine with an NVIDIA GPU and driver, or set backend: cpu");
  }
  const char* tf32 = std::getenv("GPT_CUDA_ALLOW_TF32");
  return std::make_unique<CudaBackend>(local_rank % count, tf32 && std::strcmp(tf32, "1") == 0);
}

CudaBackend::CudaBackend(int device_index, bool allow_tf32) : device_(device_index), allow_tf32_(allow_tf32) {
  check_cuda(cudaSetDevice(device_), "CudaBackend", "cudaSetDevice");
  DeviceContext& ctx = device_context(device_);
  stream_ = ctx.stream;
  sync_check_wait() = [stream = stream_, checks = wait_checks_] {
    return checks->empty() ? cudaStreamSynchronize(stream) : poll_until_idle(stream, [&checks] { checks->run(); });
  };
  OpProfile::start(stream_);
  cublas_ = ctx.cublas;
  lt_ = ctx.lt.get();
  error_device_ = ctx.error_device;
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_), "CudaBackend",
             "compute capability");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_), "CudaBackend",
             "compute capability");
  sm_ = 10 * major + minor;
  for (int i = 0; i < kStagingSlots; ++i) {
    cudaEvent_t e = nullptr;
    const cudaError_t made = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (made != cudaSuccess) {
      for (cudaEvent_t old : staging_events_) cudaEventDestroy(old);
      staging_events_.clear();
      check_cuda(made, "CudaBackend", "cudaEventCreateWithFlags (staging)");
    }
    staging_events_.push_back(e);
  }
  // A slot's previous copy is waited for by polling, as the stream is, so the communicators' checks (a
  // failed peer, a timed-out collective) still run while the copy queues behind their work.
  staging_ = std::make_unique<StagingRing>(
      kStagingSlots,
      StagingRing::Hooks{[this](size_t bytes) { return alloc_host(bytes); }, [this](void* p) { free_host(p); },
                         [this](int slot) { wait_for_staging_slot(slot); }});
}

CudaBackend::~CudaBackend() {
  // Queued work may still reference tensors the caller is about to drop; the shared context lives on.
  cudaStreamSynchronize(stream_);
  staging_.reset();
  for (cudaEvent_t e : staging_events_) cudaEventDestroy(e);
  if (OpProfile* p = OpProfile::active()) {
    p->collect(true);
    if (p->has_unreported()) std::fputs(p->report().c_str(), stderr);
  }
}

Tensor CudaBackend::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) require(d >= 0, "empty", "negative dimension in shape " + shape_str(shape));
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  const std::string what = shape_str(shape) + " " + dtype_name(dtype);
  auto storage = std::make_shared<Storage>();
  storage->ptr = CachingAllocator::instance().allocate(bytes, what.c_str());
  storage->bytes = bytes;
  storage->device = Device::CUDA;
  storage->deleter = &release_device_block;
  return Tensor(std::move(storage), 0, shape, dtype);
}

size_t CudaBackend::memory_in_use() const { return CachingAllocator::instance().in_use(); }
size_t CudaBackend::memory_peak() const { return CachingAllocator::instance().peak(); }
void CudaBackend::reset_memory_peak() { CachingAllocator::instance().reset_peak(); }
size_t CudaBackend::memory_reserved() const { return CachingAllocator::instance().reserved(); }
int64_t CudaBackend::device_allocations() const { return CachingAllocator::instance().device_allocations(); }

void CudaBackend::synchronize() { raise_device_errors(); }

void* CudaBackend::alloc_host(size_t bytes) {
  // Maybe on a thread of its own (a checkpoint snapshot's): pinned for this backend's device, and no
  // context made on device 0.
  check_cuda(cudaSetDevice(device_), "alloc_host", "cudaSetDevice");
  void* p = nullptr;
  const std::string what = "cudaMallocHost of " + std::to_string(bytes) + " bytes";
  check_cuda(cudaMallocHost(&p, std::max<size_t>(bytes, 1)), "alloc_host", what.c_str());
  return p;
}

void CudaBackend::wait_for_staging_slot(int slot) {
  const cudaEvent_t e = staging_events_.at(static_cast<size_t>(slot));
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) check_cuda(q, "upload_i32", "cudaEventQuery (staging slot)");
    if (!wait_checks_->empty()) wait_checks_->run();
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 100 ? 20 : 500));
  }
}

void CudaBackend::free_host(void* p) {
  if (!p) return;
  cudaSetDevice(device_);
  cudaFreeHost(p);
}

const void* CudaBackend::cached_device_copy(const void* host, size_t bytes, const char* op) {
  std::string key(static_cast<const char*>(host), bytes);
  auto it = device_copies_.find(key);
  if (it == device_copies_.end()) {
    Tensor copy = empty({static_cast<int64_t>((bytes + 7) / 8)}, DType::F64);
    it = device_copies_.emplace(std::move(key), copy).first;
    check_cuda(cudaMemcpyAsync(copy.raw(), it->first.data(), bytes, cudaMemcpyHostToDevice, stream_), op,
               "cudaMemcpyAsync (constant table)");
  }
  return it->second.raw();
}

namespace cuda {

void WaitChecks::add(const void* owner, std::function<void()> check) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [o, c] : checks_)
    if (o == owner) {
      c = std::move(check);
      return;
    }
  checks_.emplace_back(owner, std::move(check));
}

void WaitChecks::remove(const void* owner) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = checks_.begin(); it != checks_.end(); ++it)
    if (it->first == owner) {
      checks_.erase(it);
      return;
    }
}

bool WaitChecks::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return checks_.empty();
}

void WaitChecks::run() const {
  std::vector<std::function<void()>> checks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [owner, check] : checks_) checks.push_back(check);
  }
  for (const auto& check : checks) check();
}

cudaError_t poll_until_idle(cudaStream_t stream, const std::function<void()>& check) {
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q != cudaErrorNotReady) return q;
    check();
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 100 ? 20 : 500));
  }
}

}  // namespace cuda

// Without wait checks a plain cudaStreamSynchronize; with them a polling wait that runs them.
void CudaBackend::wait_for_stream(const char* op) {
  if (wait_checks_->empty()) {
    check_cuda(cudaStreamSynchronize(stream_), op, "cudaStreamSynchronize");
    return;
  }
  check_cuda(poll_until_idle(stream_, [this] { wait_checks_->run(); }), op, "cudaStreamQuery");
}

void CudaBackend::raise_device_errors() {
  wait_for_stream("synchronize");  // first: the copy below, into pageable memory, would block without polling
  if (OpProfile* p = OpProfile::active()) p->collect(true);
  DeviceErrorReport r{};
  check_cuda(cudaMemcpyAsync(&r, error_device_, sizeof r, cudaMemcpyDeviceToHost, stream_), "synchronize",
             "cudaMemcpyAsync (error report)");
  check_cuda(cudaStreamSynchronize(stream_), "synchronize", "cudaStreamSynchronize");
  if (r.code == 0) return;
  check_cuda(cudaMemsetAsync(error_device_, 0, sizeof r, stream_), "synchronize", "cudaMemsetAsync");
  const int code = r.code, op = r.op;
  const long long where = r.where, value = r.value, limit = r.limit;
  std::string msg = std::string("CudaBackend::") + op_name(op) + ": ";
  switch (static_cast<DeviceError>(code)) {
    case DeviceError::TargetOutOfVocabulary:
      msg += "target " + std::to_string(value) + " at row " + std::to_string(where) +
             " is outside the vocabulary [0, " + std::to_string(limit) + ") (found by the kernel, reported at the next synchronisation)";
      break;
    case DeviceError::NegativeTokenId:
      msg += "negative token id " + std::to_string(value) + " at position " + std::to_string(where) +
             " (found by the kernel, reported at the next synchronisation)";
      break;
    default: msg += "kernel reported error code " + std::to_string(code); break;
  }
  throw std::runtime_error(msg);
}

}  // namespace gpt
