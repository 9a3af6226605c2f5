// How CPU kernels read and write tensors: argument checks that throw with the op and argument named, bulk
// dtype conversion (fp32 <-> bf16 / fp16), and fp32 windows onto tensors of any float dtype. Kernels are
// written once for fp32; an F32 tensor is used in place, a 16-bit one goes through a converted copy, so a
// BF16/F16 tensor is never misread as fp32.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

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

// Read-only fp32 view of a float tensor.
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
