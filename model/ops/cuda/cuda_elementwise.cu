// Element-wise kernels of the CUDA backend, computing in fp32: tanh-approximated GELU and its derivative,
// the residual add and accumulate, and in-place scaling. (AdamW is in cuda_adamw.cu.) Where every tensor of
// a call has one dtype and starts on a 16-byte boundary, one kernel compiled for that dtype moves whole
// 16-byte chunks (a 128-bit load or store: 4 floats or 8 bf16/fp16 values) and then the last n % chunk
// elements one by one; otherwise a grid-stride loop converts each element by its own dtype. Both apply the
// same per-element function (the functors below), so they give the same bits.
#include <algorithm>
#include <cmath>

#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"
#include "model/ops/cuda/cuda_half.cuh"

namespace gpt {

using namespace cuda;

namespace {

constexpr int kThreads = 256;
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// The per-element functions: f(a, b), b unused by the one-input ones.
struct GeluForward {  // y = 0.5 x (1 + tanh(k (x + c x^3)))
  __device__ float operator()(float v, float) const {
    const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
    return 0.5f * v * (1.f + t);
  }
};
struct GeluBackward {  // dx = dy * gelu'(x), a = dy, b = x
  __device__ float operator()(float dy, float v) const {
    const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
    const float dinner = kGeluK * (1.f + 3.f * kGeluC * v * v);
    const float g = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * dinner;
    return dy * g;
  }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Scale {
  float alpha;
  __device__ float operator()(float a, float) const { return a * alpha; }
};

// out[i] = f(a[i], b[i]) for tensors of any float dtypes, element by element (b may be null).
template <class F>
__global__ void map_kernel(F f, const void* a, DType ad, const void* b, DType bd, void* out, DType od, int64_t n) {
  GRID_STRIDE(i, n) store_from_f32(out, od, i, f(load_as_f32(a, ad, i), b ? load_as_f32(b, bd, i) : 0.f));
}

// The same for tensors of one dtype T, 16-byte aligned: whole chunks of V elements, then the tail. In
// place (out == a or b) is fine: each element is read before it is written, by the same thread.
template <class T, class F>
__global__ void map_chunks_kernel(F f, const T* a, const T* b, T* out, int64_t n) {
  constexpr int V = kChunk<T>;
  const int64_t chunks = n / V;
  GRID_STRIDE(c, chunks) {
    float x[V], y[V], r[V];
    load_chunk<V>(a + c * V, x);
    if (b) load_chunk<V>(b + c * V, y);
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = f(x[i], b ? y[i] : 0.f);
    store_chunk<V>(out + c * V, r);
  }
  GRID_STRIDE(t, n - chunks * V) {
    const int64_t i = chunks * V + t;
    out[i] = from_f32<T>(f(to_f32(a[i]), b ? to_f32(b[i]) : 0.f));
  }
}

// out = f(a, b) over n elements, on the chunked kernel where the dtypes and addresses allow.
template <class F>
void launch_map(F f, const Tensor& a, const Tensor* b, Tensor& out, int64_t n, cudaStream_t stream) {
  const DType t = a.dtype();
  const bool one_dtype = out.dtype() == t && (!b || b->dtype() == t);
  if (one_dtype && aligned_to(16, {a.raw(), out.raw(), b ? b->raw() : nullptr})) {
    with_float_type(t, [&](auto tag) {
      using T = decltype(tag);
      const int64_t work = std::max<int64_t>(n / kChunk<T>, n % kChunk<T>);
      map_chunks_kernel<T><<<grid_for(work, kThreads), kThreads, 0, stream>>>(
          f, static_cast<const T*>(a.raw()), b ? static_cast<const T*>(b->raw()) : nullptr, static_cast<T*>(out.raw()),
          n);
    });
    return;
  }
  map_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(f, a.raw(), a.dtype(), b ? b->raw() : nullptr,
                                                            b ? b->dtype() : t, out.raw(), out.dtype(), n);
}

}  // namespace

void CudaBackend::gelu_forward(const Tensor& x, Tensor& y) {
  const char* op = "gelu_forward";
  ops::check_elementwise(kChecks, op, {{x, "x"}, {y, "y"}});
  const int64_t n = x.numel();
  if (n == 0) return;
  launch_map(GeluForward{}, x, nullptr, y, n, stream_);
  check_launch(op);
}

void CudaBackend::gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "gelu_backward";
  ops::check_elementwise(kChecks, op, {{x, "x"}, {dy, "dy"}, {dx, "dx"}});
  const int64_t n = x.numel();
  if (n == 0) return;
  launch_map(GeluBackward{}, dy, &x, dx, n, stream_);
  check_launch(op);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  ops::check_elementwise(kChecks, op, {{a, "a"}, {b, "b"}, {out, "out"}});
  const int64_t n = a.numel();
  if (n == 0) return;
  launch_map(Add{}, a, &b, out, n, stream_);
  check_launch(op);
}

void CudaBackend::accumulate(const Tensor& src, Tensor& dst) {
  const char* op = "accumulate";
  ops::check_elementwise(kChecks, op, {{src, "src"}, {dst, "dst"}});
  const int64_t n = src.numel();
  if (n == 0) return;
  launch_map(Add{}, dst, &src, dst, n, stream_);
  check_launch(op);
}

void CudaBackend::scale(Tensor& t, float alpha) {
  require_float(t, "scale", "t");
  const int64_t n = t.numel();
  if (n == 0) return;
  launch_map(Scale{alpha}, t, nullptr, t, n, stream_);
  check_launch("scale");
}

}  // namespace gpt
