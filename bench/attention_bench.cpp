// attention_bench: the CPU backend's fused attention against the materialised attention it replaced
// (tests/reference/, which keeps the [B, H, T, T] softmax), one forward plus backward of the attention
// core at a given shape and dtype: best-of-N wall time and the bytes each needs beyond its inputs and
// outputs (the materialised probabilities; the fused kernels' per-thread scratch is not a tensor and is
// about threads x (2 blocks of 64 x 128 floats + T x D floats)).
//
//   attention_bench B T H D fp32|bf16 [repetitions]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "model/ops/backend.h"
#include "tests/reference/materialized_attention.h"

namespace gpt {
namespace {

Tensor random_tensor(Backend& be, const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = be.empty(shape, dtype);
  std::vector<float> host(t.numel());
  std::normal_distribution<float> d;
  for (auto& x : host) x = d(rng);
  be.upload(host.data(), t);
  return t;
}

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

int run(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: attention_bench B T H D fp32|bf16 [repetitions]\n");
    return 2;
  }
  const int64_t B = std::atoll(argv[1]), T = std::atoll(argv[2]), H = std::atoll(argv[3]), D = std::atoll(argv[4]);
  const std::string dt = argv[5];
  const int reps = argc > 6 ? std::atoi(argv[6]) : 5;
  if (B <= 0 || T <= 0 || H <= 0 || D <= 0 || (dt != "fp32" && dt != "bf16") || reps <= 0) {
    std::fprintf(stderr, "attention_bench: B, T, H, D and repetitions must be positive, dtype fp32 or bf16\n");
    return 2;
  }
  const DType dtype = dt == "bf16" ? DType::BF16 : DType::F32;
  auto be = make_backend("cpu");
  std::mt19937 rng(7);
  Tensor qkv = random_tensor(*be, {B * T, 3 * H * D}, dtype, rng), dout = random_tensor(*be, {B * T, H * D}, dtype, rng);
  Tensor out = be->empty({B * T, H * D}, dtype), dqkv = be->empty({B * T, 3 * H * D}, dtype);
  Tensor lse = be->empty({B, H, T});
  const double fused_fwd = best_seconds(reps, [&] { be->attention_forward(qkv, B, T, H, H, D, out, lse); });
  const double fused_bwd =
      best_seconds(reps, [&] { be->attention_backward(dout, qkv, out, lse, B, T, H, H, D, dqkv); });
  const double fused = fused_fwd + fused_bwd;
  // The reference computes in fp32: bf16 inputs are converted (whole-tensor copies) as the backend did.
  Tensor out32 = be->empty({B * T, H * D}), dqkv32 = be->empty({B * T, 3 * H * D});
  Tensor probs = be->empty({B, H, T, T});
  const double materialized_fwd =
      best_seconds(reps, [&] { reference::materialized_attention_forward(qkv, B, T, H, H, D, out32, probs); });
  const double materialized_bwd = best_seconds(
      reps, [&] { reference::materialized_attention_backward(dout, qkv, probs, B, T, H, H, D, dqkv32); });
  const double materialized = materialized_fwd + materialized_bwd;
  const double flops = 4.0 * B * H * T * T * D * 3.5 / 2;  // causal half of QK^T, PV forward; 5 products back
  std::printf("B=%lld T=%lld H=%lld D=%lld %s threads=%d: fused %.2f ms (%.1f GFLOP/s), materialised %.2f ms, "
              "fused/materialised time %.2f (forward %.2f, backward %.2f); probabilities %.1f MiB\n",
              (long long)B, (long long)T, (long long)H, (long long)D, dt.c_str(), omp_get_max_threads(), fused * 1e3,
              flops / fused / 1e9, materialized * 1e3, fused / materialized, fused_fwd / materialized_fwd,
              fused_bwd / materialized_bwd, probs.bytes() / 1048576.0);
  return 0;
}

}  // namespace
}  // namespace gpt

int main(int argc, char** argv) {
  try {
    return gpt::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}
