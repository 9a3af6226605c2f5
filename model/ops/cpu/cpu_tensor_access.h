// How CPU kernels read and write tensors: argument checks that throw with the op and argument named, bulk
// dtype conversion (fp32 <-> bf16 / fp16), and fp32 views of tensors of any float dtype. Kernels are
// written once for fp32; an F32 tensor is used in place, a 16-bit one is converted, so a BF16/F16 tensor
// is never misread as fp32. Kernels that walk a tensor in pieces (rows, element ranges) use Windows, which
// converts one piece at a time through a small per-thread buffer, so the bf16 path makes no whole-tensor
// fp32 copy; F32Input/F32Output convert whole tensors and serve the few kernels that need random access.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/ops/cpu/cpu_parallel.h"
#include "model/ops/op_checks.h"
#include "model/tensor.h"

namespace gpt::cpu {

// The shared argument checks (model/ops/op_checks.h), as the CPU backend: messages read
// "CpuBackend::<op>: ...", and tensors must live in host memory.
inline constexpr ops::OpChecks kChecks{"CpuBackend", Device::CPU};

inline void require(bool ok, const char* op, const std::string& message) { kChecks.require(ok, op, message); }
inline void require_float(const Tensor& t, const char* op, const char* arg) { kChecks.require_float(t, op, arg); }
inline void require_dtype(const Tensor& t, DType dtype, const char* op, const char* arg) {
  kChecks.require_dtype(t, dtype, op, arg);
}
inline void require_numel(const Tensor& t, int64_t numel, const char* op, const char* arg, const std::string& what) {
  kChecks.require_numel(t, numel, op, arg, what);
}
using ops::describe;
using ops::is_float;

// Element-wise conversions between an fp32 array and n elements of a float dtype (F32 is a plain copy).
// Parallel over OpenMP threads for large n.
// memcpy split across threads in 1 MiB chunks when there are more than four (copies of a few MB and up).
void parallel_memcpy(void* dst, const void* src, size_t bytes);
void to_f32(const void* src, DType src_dtype, float* dst, int64_t n);
void from_f32(const float* src, void* dst, DType dst_dtype, int64_t n);

// A kernel's temporary buffer from the backend's recycled-block pool (cpu_memory.cpp), so that conversion
// copies made every step do not page-fault afresh each time. Not counted in memory_in_use().
class ScratchBuffer {
 public:
  explicit ScratchBuffer(size_t bytes);
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Bytes of ScratchBuffer in use now, and the most in use at once since the process started (or since the
// last reset_scratch_peak()): the conversion copies' share of memory, which the tensor counters leave out.
size_t scratch_bytes_in_use();
size_t scratch_bytes_peak();
void reset_scratch_peak();

// fp32 windows onto pieces of float tensors, for a kernel that walks tensors piece by piece. An F32 tensor
// is used in place. A 16-bit tensor is converted one piece at a time through a buffer that this object
// owns (one per slot, grown when a larger piece comes and reused for every piece after), so its fp32 form
// never exists whole. Use one object per thread; check dtypes (require_float) once before the loop.
class Windows {
 public:
  static constexpr int kSlots = 4;
  // Elements [lo, lo + len) of t as fp32, read only.
  const float* in(int slot, const Tensor& t, int64_t lo, int64_t len);
  // Elements [lo, lo + len) of t to write as fp32, holding t's current values when `load` (for "+="
  // outputs). store() then writes a 16-bit tensor's window back, rounded once; for F32 it does nothing.
  float* out(int slot, Tensor& t, int64_t lo, int64_t len, bool load = false);
  void store(int slot, Tensor& t, int64_t lo, int64_t len) const;

 private:
  float* buffer(int slot, int64_t len);
  std::unique_ptr<float[]> buf_[kSlots];
  int64_t capacity_[kSlots] = {};
};

// Calls f(windows, lo, len) on consecutive pieces [lo, lo + len) of [0, n), spread over the OpenMP threads
// when n exceeds `parallel_above`, with one Windows object per thread: for element-wise kernels. Pieces are
// 4096 elements, so a thread's converted windows stay in its cache.
template <class F>
void for_each_window(int64_t n, int64_t parallel_above, F&& f) {
  constexpr int64_t kPiece = 4096;
  const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel if (n > parallel_above)
  {
    Windows windows;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < pieces; ++p) f(windows, p * kPiece, std::min(kPiece, n - p * kPiece));
  }
}

// Calls row(windows, n, partial) for every row n of [0, N), the rows cut into one contiguous block per
// OpenMP thread (threaded when N * width exceeds `parallel_above`), `partial` being that thread's own
// `width` floats, zeroed first; then combine(partial) once per thread, in thread order. For kernels that
// sum per-column gradients over rows (layernorm's gamma and beta): the fixed blocks and order keep the
// result reproducible.
template <class Row, class Combine>
void rows_with_partial_sums(int64_t N, int64_t width, int64_t parallel_above, Row&& row, Combine&& combine) {
  const int nt = threads_for(N * width, parallel_above);
  std::vector<float> partial(static_cast<size_t>(nt) * width, 0.f);
  int used = 1;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
#pragma omp single
    used = omp_get_num_threads();
    int64_t r0, r1;
    chunk_range(N, t, omp_get_num_threads(), r0, r1);
    float* mine = partial.data() + static_cast<size_t>(t) * width;
    Windows windows;
    for (int64_t n = r0; n < r1; ++n) row(windows, n, mine);
  }
  for (int t = 0; t < used; ++t) combine(partial.data() + static_cast<size_t>(t) * width);
}

// Read-only fp32 view of a float tensor (a whole-tensor copy for a 16-bit one).
class F32Input {
 public:
  F32Input(const Tensor& t, const char* op, const char* arg);
  const float* get() const { return ptr_; }

 private:
  std::unique_ptr<ScratchBuffer> scratch_;
  const float* ptr_ = nullptr;
};

// Read-only bf16 view of a float tensor, for the bf16 GEMM: a BF16 tensor is used in place, any other float
// tensor is rounded (to nearest even) into a scratch copy.
class Bf16Input {
 public:
  Bf16Input(const Tensor& t, const char* op, const char* arg);
  const uint16_t* get() const { return ptr_; }

 private:
  std::unique_ptr<ScratchBuffer> scratch_;
  const uint16_t* ptr_ = nullptr;
};

// A matrix-product operand read once in the precision the products use: bf16 bits (a BF16 tensor in place,
// any other float tensor rounded into a copy) or fp32 (an F32 tensor in place, a 16-bit one converted).
class ProductOperand {
 public:
  ProductOperand(const Tensor& t, bool bf16, const char* op, const char* arg);
  bool bf16() const { return bf16_.has_value(); }
  // The operand's data from element `element` on (bf16 bits or fp32, as bf16() says).
  const void* at(int64_t element = 0) const {
    return bf16_ ? static_cast<const void*>(bf16_->get() + element) : static_cast<const void*>(f32_->get() + element);
  }

 private:
  std::optional<Bf16Input> bf16_;
  std::optional<F32Input> f32_;
};

// Writable fp32 view of a float tensor. For a 16-bit tensor the kernel writes a scratch buffer and
// commit() rounds it back into the tensor; `load` pre-fills the scratch with the current values (needed
// for "+=" outputs). Call commit() once the kernel is done; for F32 tensors it does nothing.
class F32Output {
 public:
  F32Output(Tensor& t, bool load, const char* op, const char* arg);
  float* get() const { return ptr_; }
  void commit();

 private:
  Tensor tensor_;
  std::unique_ptr<ScratchBuffer> scratch_;
  float* ptr_ = nullptr;
};

}  // namespace gpt::cpu
