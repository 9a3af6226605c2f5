// Argument checks, bulk dtype conversion and the fp32 tensor windows declared in cpu_tensor_access.h.
// fp16 conversion uses the F16C instructions when the CPU has them, checked at run time (same
// round-to-nearest-even result as the scalar code in half.h, which handles the tails and other CPUs).
#include "model/ops/cpu/cpu_tensor_access.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "model/ops/cpu/cpu_dispatch.h"
#include "model/ops/half.h"

#include <immintrin.h>

namespace gpt::cpu {

namespace {

// Conversions are memory bound; below this many elements threads cost more than they save.
constexpr int64_t kParallelConvert = 1 << 15;

__attribute__((target("avx,f16c"))) int64_t fp16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  return i;
}

__attribute__((target("avx,f16c"))) int64_t f32_to_fp16_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  return i;
}

bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}

void fp16_to_f32_range(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = has_f16c() ? fp16_to_f32_f16c(src, dst, n) : 0;
  for (; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

void f32_to_fp16_range(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = has_f16c() ? f32_to_fp16_f16c(src, dst, n) : 0;
  for (; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

GPT_CPU_KERNEL void bf16_to_f32_range(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(src[i]);
}

GPT_CPU_KERNEL void f32_to_bf16_range(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = fp32_to_bf16(src[i]);
}

// One piece, on the calling thread.
void convert_to_f32(const void* src, DType src_dtype, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (src_dtype == DType::F16) {
    fp16_to_f32_range(s, dst, n);
  } else {
    bf16_to_f32_range(s, dst, n);
  }
}

void convert_from_f32(const float* src, void* dst, DType dst_dtype, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dst_dtype == DType::F16) {
    f32_to_fp16_range(src, d, n);
  } else {
    f32_to_bf16_range(src, d, n);
  }
}

}  // namespace

void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kChunk = size_t(1) << 20;
  const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (chunks > 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t lo = c * kChunk;
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, std::min(kChunk, bytes - lo));
  }
}

void to_f32(const void* src, DType src_dtype, float* dst, int64_t n) {
  if (src_dtype == DType::F32) {
    parallel_memcpy(dst, src, n * sizeof(float));
    return;
  }
  if (!is_float(src_dtype)) throw std::runtime_error(std::string("to_f32: not a float dtype: ") + dtype_name(src_dtype));
  const uint16_t* s = static_cast<const uint16_t*>(src);
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelConvert)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t lo = blk * kBlock;
    convert_to_f32(s + lo, src_dtype, dst + lo, std::min(kBlock, n - lo));
  }
}

void from_f32(const float* src, void* dst, DType dst_dtype, int64_t n) {
  if (dst_dtype == DType::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  if (!is_float(dst_dtype)) throw std::runtime_error(std::string("from_f32: not a float dtype: ") + dtype_name(dst_dtype));
  uint16_t* d = static_cast<uint16_t*>(dst);
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelConvert)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t lo = blk * kBlock;
    convert_from_f32(src + lo, d + lo, dst_dtype, std::min(kBlock, n - lo));
  }
}

float* Windows::buffer(int slot, int64_t len) {
  if (capacity_[slot] < len) {
    buf_[slot].reset(new float[len]);
    capacity_[slot] = len;
  }
  return buf_[slot].get();
}

const float* Windows::in(int slot, const Tensor& t, int64_t lo, int64_t len) {
  if (t.dtype() == DType::F32) return t.f32() + lo;
  float* w = buffer(slot, len);
  convert_to_f32(static_cast<const uint16_t*>(t.raw()) + lo, t.dtype(), w, len);
  return w;
}

float* Windows::out(int slot, Tensor& t, int64_t lo, int64_t len, bool load) {
  if (t.dtype() == DType::F32) return t.f32() + lo;
  float* w = buffer(slot, len);
  if (load) convert_to_f32(static_cast<const uint16_t*>(t.raw()) + lo, t.dtype(), w, len);
  return w;
}

void Windows::store(int slot, Tensor& t, int64_t lo, int64_t len) const {
  if (t.dtype() == DType::F32) return;
  convert_from_f32(buf_[slot].get(), static_cast<uint16_t*>(t.raw()) + lo, t.dtype(), len);
}

F32Input::F32Input(const Tensor& t, const char* op, const char* arg) {
  require_float(t, op, arg);
  if (t.dtype() == DType::F32) {
    ptr_ = t.f32();
    return;
  }
  scratch_ = std::make_unique<ScratchBuffer>(t.numel() * sizeof(float));
  to_f32(t.raw(), t.dtype(), scratch_->as<float>(), t.numel());
  ptr_ = scratch_->as<float>();
}

Bf16Input::Bf16Input(const Tensor& t, const char* op, const char* arg) {
  require_float(t, op, arg);
  if (t.dtype() == DType::BF16) {
    ptr_ = static_cast<const uint16_t*>(t.raw());
    return;
  }
  scratch_ = std::make_unique<ScratchBuffer>(t.numel() * sizeof(uint16_t));
  if (t.dtype() == DType::F32) {
    from_f32(t.f32(), scratch_->as<uint16_t>(), DType::BF16, t.numel());
  } else {
    F32Input f(t, op, arg);
    from_f32(f.get(), scratch_->as<uint16_t>(), DType::BF16, t.numel());
  }
  ptr_ = scratch_->as<uint16_t>();
}

ProductOperand::ProductOperand(const Tensor& t, bool bf16, const char* op, const char* arg) {
  if (bf16) {
    bf16_.emplace(t, op, arg);
  } else {
    f32_.emplace(t, op, arg);
  }
}

F32Output::F32Output(Tensor& t, bool load, const char* op, const char* arg) : tensor_(t) {
  require_float(t, op, arg);
  if (t.dtype() == DType::F32) {
    ptr_ = t.f32();
    return;
  }
  scratch_ = std::make_unique<ScratchBuffer>(t.numel() * sizeof(float));
  if (load) to_f32(t.raw(), t.dtype(), scratch_->as<float>(), t.numel());
  ptr_ = scratch_->as<float>();
}

void F32Output::commit() {
  if (scratch_) from_f32(scratch_->as<float>(), tensor_.raw(), tensor_.dtype(), tensor_.numel());
}

}  // namespace gpt::cpu
