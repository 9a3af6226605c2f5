// bf16 / fp16 <-> fp32 conversions usable in kernels and on the host, bit for bit the same as
// model/ops/half.h (round-to-nearest-even, NaN quietened with sign and top payload bits kept, fp16
// overflow to +-inf, fp16 subnormals rounded by hand), so a tensor cast on the GPU holds exactly the bits
// the CPU backend would produce. The hardware converters round the same way but canonicalise NaNs, hence
// the integer versions here. Also: reading and writing one element of a float tensor of any dtype as fp32,
// and, for kernels compiled once per dtype, the storage types (float, Bf16, F16), a dispatch from DType to
// them, and aligned chunks of V elements (16 bytes: one 128-bit load or store per chunk).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "model/tensor.h"

namespace gpt::cuda {

__host__ __device__ inline uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

__host__ __device__ inline float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

__host__ __device__ inline float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

__host__ __device__ inline uint16_t f32_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep it NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even; a carry into the exponent is correct
  return static_cast<uint16_t>(u >> 16);
}

__host__ __device__ inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;  // subnormal: mant * 2^-24, exact
    return bits_float(sign | float_bits(mag));
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

__host__ __device__ inline uint16_t f32_to_f16(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((ax >> 13) & 0x3ffu);  // quiet NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above round to Inf
  if (ax < 0x38800000u) {
    // Below the smallest normal fp16: mant * 2^-24 with the rounding done by hand.
    const int biased = static_cast<int>(ax >> 23);
    const int shift = 126 - biased;
    if (shift > 24) return sign;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  ax += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + ((ax >> 13) & 1u);
  return sign | static_cast<uint16_t>(ax >> 13);
}

// Element i of a float tensor's memory, as fp32. The dtype is the same for every thread of a launch, so
// the switch never diverges.
__host__ __device__ inline float load_as_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Stores fp32 `v` into element i, rounded to the tensor's dtype.
__host__ __device__ inline void store_from_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// The storage types of kernels compiled per dtype: float, and bf16 / fp16 held as their bits.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

__host__ __device__ inline float to_f32(float v) { return v; }
__host__ __device__ inline float to_f32(Bf16 v) { return bf16_to_f32(v.bits); }
__host__ __device__ inline float to_f32(F16 v) { return f16_to_f32(v.bits); }

template <class T>
__host__ __device__ inline T from_f32(float v);
template <>
__host__ __device__ inline float from_f32<float>(float v) {
  return v;
}
template <>
__host__ __device__ inline Bf16 from_f32<Bf16>(float v) {
  return {f32_to_bf16(v)};
}
template <>
__host__ __device__ inline F16 from_f32<F16>(float v) {
  return {f32_to_f16(v)};
}

// Calls f(T{}) with T the storage type of float dtype `t` (F32, BF16 or F16), for launching a kernel
// template: `with_float_type(x.dtype(), [&](auto tag) { kernel<decltype(tag)><<<...>>>(...); })`.
template <class F>
void with_float_type(DType t, F&& f) {
  switch (t) {
    case DType::BF16: f(Bf16{}); break;
    case DType::F16: f(F16{}); break;
    default: f(float{}); break;
  }
}

// Elements per 16-byte chunk of T (4 floats, 8 16-bit values).
template <class T>
constexpr int kChunk = 16 / static_cast<int>(sizeof(T));

// V consecutive elements of T, aligned to their size, loaded and stored as one access (128 bits when V is
// kChunk<T>). V = 1 is a plain element, for rows whose width or address does not allow whole chunks.
template <class T, int V>
struct alignas(sizeof(T) * V) Chunk {
  T v[V];
};

#ifdef __CUDACC__  // (this header is also read by host-only files, which have no use for these)
template <int V, class T>
__device__ inline void load_chunk(const T* p, float (&out)[V]) {
  const Chunk<T, V> c = *reinterpret_cast<const Chunk<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = to_f32(c.v[i]);
}

template <int V, class T>
__device__ inline void store_chunk(T* p, const float (&in)[V]) {
  Chunk<T, V> c;
#pragma unroll
  for (int i = 0; i < V; ++i) c.v[i] = from_f32<T>(in[i]);
  *reinterpret_cast<Chunk<T, V>*>(p) = c;
}
#endif

// Whether every pointer starts on a `bytes` boundary (so chunks of that size can be read from it).
inline bool aligned_to(int64_t bytes, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % bytes != 0) return false;
  return true;
}

template <int V>
using Width = std::integral_constant<int, V>;

// Calls f(Width<kChunk<T>>) when every row width in `widths` is a multiple of a chunk and every pointer
// starts on a chunk boundary (of its own element type: `ptrs` pairs a pointer with its element size),
// else f(Width<1>).
template <class T, class F>
void with_chunk_width(std::initializer_list<int64_t> widths, std::initializer_list<std::pair<const void*, int64_t>> ptrs,
                      F&& f) {
  constexpr int V = kChunk<T>;
  bool whole = true;
  for (int64_t w : widths) whole = whole && w % V == 0;
  for (auto [p, elem] : ptrs) whole = whole && aligned_to(elem * V, {p});
  if (whole)
    f(Width<V>{});
  else
    f(Width<1>{});
}

// For the per-row norm kernels: calls f(T{}, W{}, Width<V>{}) with T the storage type of x's dtype, W
// gamma's (x's own, or float) and V the chunk width, kChunk<T> when the row width C and every address
// allow it, else 1. `rows` point at T elements, `params` at W elements; null pointers are skipped.
template <class F>
void with_row_kernel(const Tensor& x, const Tensor& gamma, int64_t C, std::initializer_list<const void*> rows,
                     std::initializer_list<const void*> params, F&& f) {
  with_float_type(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const auto dispatch = [&](auto w) {
      using W = decltype(w);
      constexpr int V = kChunk<T>;
      bool whole = C % V == 0;
      for (const void* p : rows) whole = whole && aligned_to(static_cast<int64_t>(sizeof(T)) * V, {p});
      for (const void* p : params) whole = whole && aligned_to(static_cast<int64_t>(sizeof(W)) * V, {p});
      if (whole)
        f(t, w, Width<V>{});
      else
        f(t, w, Width<1>{});
    };
    if (gamma.dtype() == DType::F32)
      dispatch(float{});
    else
      dispatch(T{});
  });
}

}  // namespace gpt::cuda
