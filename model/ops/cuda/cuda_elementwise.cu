// Element-wise kernels of the CUDA backend, one grid-stride loop each over the flat elements, computing in
// fp32 whatever the tensors' dtypes: tanh-approximated GELU and its derivative, the residual add and
// accumulate, and in-place scaling. (AdamW is in cuda_adamw.cu.)
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

// y = 0.5 x (1 + tanh(k (x + c x^3))).
__global__ void gelu_forward_kernel(const void* x, DType xd, void* y, DType yd, int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = load_as_f32(x, xd, i);
    const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
    store_from_f32(y, yd, i, 0.5f * v * (1.f + t));
  }
}

// dx = dy * gelu'(x).
__global__ void gelu_backward_kernel(const void* dy, DType dyd, const void* x, DType xd, void* dx, DType dxd,
                                     int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = load_as_f32(x, xd, i);
    const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
    const float dinner = kGeluK * (1.f + 3.f * kGeluC * v * v);
    const float g = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * dinner;
    store_from_f32(dx, dxd, i, load_as_f32(dy, dyd, i) * g);
  }
}

// out = a + b.
__global__ void add_kernel(const void* a, DType ad, const void* b, DType bd, void* out, DType od, int64_t n) {
  GRID_STRIDE(i, n) store_from_f32(out, od, i, load_as_f32(a, ad, i) + load_as_f32(b, bd, i));
}

// t *= alpha.
__global__ void scale_kernel(void* t, DType td, float alpha, int64_t n) {
  GRID_STRIDE(i, n) store_from_f32(t, td, i, load_as_f32(t, td, i) * alpha);
}

}  // namespace

void CudaBackend::gelu_forward(const Tensor& x, Tensor& y) {
  const char* op = "gelu_forward";
  ops::check_elementwise(kChecks, op, {{x, "x"}, {y, "y"}});
  const int64_t n = x.numel();
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_>>>(x.raw(), x.dtype(), y.raw(), y.dtype(), n);
  check_launch(op);
}

void CudaBackend::gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "gelu_backward";
  ops::check_elementwise(kChecks, op, {{x, "x"}, {dy, "dy"}, {dx, "dx"}});
  const int64_t n = x.numel();
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_>>>(dy.raw(), dy.dtype(), x.raw(), x.dtype(),
                                                                        dx.raw(), dx.dtype(), n);
  check_launch(op);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  ops::check_elementwise(kChecks, op, {{a, "a"}, {b, "b"}, {out, "out"}});
  const int64_t n = a.numel();
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_>>>(a.raw(), a.dtype(), b.raw(), b.dtype(), out.raw(),
                                                              out.dtype(), n);
  check_launch(op);
}

void CudaBackend::accumulate(const Tensor& src, Tensor& dst) {
  const char* op = "accumulate";
  ops::check_elementwise(kChecks, op, {{src, "src"}, {dst, "dst"}});
  const int64_t n = src.numel();
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_>>>(dst.raw(), dst.dtype(), src.raw(), src.dtype(),
                                                              dst.raw(), dst.dtype(), n);
  check_launch(op);
}

void CudaBackend::scale(Tensor& t, float alpha) {
  require_float(t, "scale", "t");
  const int64_t n = t.numel();
  if (n == 0) return;
  scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_>>>(t.raw(), t.dtype(), alpha, n);
  check_launch("scale");
}

}  // namespace gpt
