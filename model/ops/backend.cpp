// Backend pieces shared by every implementation (zeros, plain host memory, the composed linear+GELU and
// add+LayerNorm defaults) and the factory that maps the config's `backend` value to an implementation
// compiled into this binary.
#include "model/ops/backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/ops/cpu/cpu_backend.h"
#ifdef GPT_HAVE_CUDA
#include "model/ops/cuda/cuda_factory.h"
#endif

namespace gpt {

void* Backend::alloc_host(size_t bytes) {
  // Large buffers in 2 MiB pages where the kernel offers them: first touching a GB takes a fraction of
  // the page faults.
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (!p) throw std::runtime_error("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
  if (align == kHuge) madvise(p, rounded, MADV_HUGEPAGE);  // a hint: failure changes nothing
  return p;
}

void Backend::free_host(void* p) { std::free(p); }

Tensor Backend::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  fill(t, 0.f);
  return t;
}

void Backend::linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& pre, Tensor& act) {
  linear_forward(x, w, b, pre);
  gelu_forward(pre, act);
}

void Backend::linear_dgelu_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre,
                                    Tensor& dpre, Tensor& dw, Tensor* db) {
  Tensor dact = empty(pre.shape(), pre.dtype());
  linear_backward(dy, x, w, &dact, dw, db);
  gelu_backward(dact, pre, dpre);
}

void Backend::add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                    Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, float eps) {
  add(x, r, h);
  layernorm_forward(h, gamma, beta, y, mean, rstd, eps);
}

void Backend::layernorm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& rstd, const Tensor& dres, Tensor& dx, Tensor& dgamma,
                                     Tensor& dbeta) {
  layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  accumulate(dres, dx);
}

std::unique_ptr<Backend> make_backend(const std::string& name, int local_rank) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
  if (name == "cuda") {
#ifdef GPT_HAVE_CUDA
    return make_cuda_backend(local_rank);
#else
    throw std::runtime_error(
        "backend 'cuda' requested (local rank " + std::to_string(local_rank) +
        ") but the CUDA backend is not built into this binary; rebuild with the CUDA toolkit available "
        "(cmake -DGPT_CUDA=ON) or set backend: cpu");
#endif
  }
  throw std::runtime_error("unknown backend '" + name + "': valid values are 'cpu' and 'cuda'");
}

void Backend::ce_row_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                           Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  ce_row_max(logits, vocab_start, vocab_size, row_max);
  ce_sum_exp(logits, row_max, targets, vocab_start, vocab_size, sum_exp, target_logit);
}

float Backend::fp8_quantize_dequantize(const Tensor& x, float scale, Fp8Format format, Tensor& out) {
  if (out.numel() != x.numel() || out.dtype() != DType::F32)
    throw std::invalid_argument("fp8_quantize_dequantize: out must be F32 with x's " +
                                std::to_string(x.numel()) + " elements");
  std::vector<float> v(static_cast<size_t>(x.numel()));
  download(x, v.data());
  const int64_t n = x.numel();
  float amax = 0.f;
  bool nan = false;
#pragma omp parallel for reduction(max : amax) reduction(|| : nan)
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    if (std::isnan(a)) nan = true;
    else amax = std::max(amax, a);
    v[i] = fp8_round(v[i] * scale, format) / scale;
  }
  upload(v.data(), out);
  return nan ? NAN : amax;
}

}  // namespace gpt
