// The CPU probe of `gpt-train plan --probe` (see app/plan.h): this machine's CPU backend measured as a
// planner hardware description (GEMM rates by shape, memory bandwidth, the optimizer's and the loss's passes),
// each measurement the best of a few repetitions.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/plan.h"
#include "model/ops/backend.h"

namespace gpt {

namespace {
// ---- CPU probe: each measurement is the best of a few repetitions ----

template <typename F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  f();  // warm-up
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

Tensor random_tensor(Backend& be, const Shape& shape, DType dtype, float scale = 0.1f) {
  Tensor t = be.empty(shape, dtype);
  std::vector<float> host(static_cast<size_t>(t.numel()));
  uint32_t x = 12345;
  for (float& v : host) {
    x = x * 1664525u + 1013904223u;
    v = scale * (static_cast<float>(x >> 8) / 16777216.0f - 0.5f);
  }
  be.upload(host.data(), t);
  return t;
}

// Seconds of the three products of a linear layer y[m, n] = x[m, k] . w[n, k]^T as the trainer runs them
// (forward, input gradient, weight gradient), the best of a few repetitions (fewer for the big ones: about
// a third of a second each). The table's entry for (m, n, k) is their average rate: the CPU backend's
// three product kernels run at different speeds, and every linear layer runs all three.
double linear_seconds(Backend& be, int64_t m, int64_t n, int64_t k, DType dtype) {
  Tensor x = random_tensor(be, {m, k}, dtype), w = random_tensor(be, {n, k}, dtype), y = be.empty({m, n}, dtype);
  Tensor dy = random_tensor(be, {m, n}, dtype), dx = be.empty({m, k}, dtype), dw = be.zeros({n, k});
  auto once = [&] {
    be.linear_forward(x, w, nullptr, y);
    be.linear_backward(dy, x, w, &dx, dw, nullptr);
  };
  const auto t0 = std::chrono::steady_clock::now();
  once();
  const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int reps = static_cast<int>(std::clamp(0.3 / std::max(first, 1e-9), 2.0, 8.0));
  return best_seconds(reps, once);
}

// The GEMM efficiency table of this machine: fp32 linear layers on a grid of shapes (128, 512, 2048 on
// each axis) and three with one vocabulary-sized axis (32768, as an LM head has), each over the fastest
// one's rate, which is returned in *peak_flops.
GemmEfficiencyTable probe_gemm_table(Backend& be, double* peak_flops) {
  const int64_t sizes[] = {128, 512, 2048};
  std::vector<std::array<int64_t, 3>> shapes;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : sizes) shapes.push_back({m, n, k});
  const int64_t wide = 32768, narrow = 512;
  shapes.push_back({wide, narrow, narrow});
  shapes.push_back({narrow, wide, narrow});
  shapes.push_back({narrow, narrow, wide});
  std::vector<GemmShapeEfficiency> entries;
  double peak = 0;
  for (const auto& [m, n, k] : shapes) {
    const double rate = 3 * 2.0 * m * n * k / linear_seconds(be, m, n, k, DType::F32);
    entries.push_back({double(m), double(n), double(k), rate});
    peak = std::max(peak, rate);
  }
  for (GemmShapeEfficiency& e : entries) e.efficiency /= peak;
  *peak_flops = peak;
  return GemmEfficiencyTable(std::move(entries));
}

}  // namespace

// ---- CPU probe ----

HardwareSpec probe_cpu(int threads, int devices_per_node) {
  omp_set_num_threads(threads);
  auto be = make_backend("cpu");
  HardwareSpec hw;
  hw.name = "cpu-probe";
  hw.description = fmt::format("this machine's CPU backend, {} thread(s) per device (measured by gpt-train plan --probe)",
                               threads);
  hw.devices_per_node = devices_per_node;
  {
    // The table in fp32; the bf16 peak is bf16's rate at the fastest fp32 shape, and the table's
    // fractions are applied to it too.
    double peak = 0;
    hw.gemm_efficiency = probe_gemm_table(*be, &peak);
    hw.peak_tflops_fp32 = peak / 1e12;
    GemmShapeEfficiency fastest;
    for (const GemmShapeEfficiency& e : hw.gemm_efficiency.entries())
      if (e.efficiency == 1.0) fastest = e;
    const auto m = static_cast<int64_t>(fastest.m), n = static_cast<int64_t>(fastest.n), k = static_cast<int64_t>(fastest.k);
    hw.peak_tflops_16bit = 3 * 2.0 * m * n * k / linear_seconds(*be, m, n, k, DType::BF16) / 1e12;
  }
  {
    // Attention core forward + backward at config M's shape (heads of 64, seq 256).
    const int64_t B = 1, T = 256, H = 6, D = 64;
    Tensor qkv = random_tensor(*be, {B * T, 3 * H * D}, DType::F32), out = be->empty({B * T, H * D});
    Tensor lse = be->empty({B, H, T}), dout = random_tensor(*be, {B * T, H * D}, DType::F32);
    Tensor dqkv = be->empty({B * T, 3 * H * D});
    double t = best_seconds(8, [&] {
      be->attention_forward(qkv, B, T, H, H, D, out, lse);
      be->attention_backward(dout, qkv, out, lse, B, T, H, H, D, dqkv);
    });
    // The time model charges forward and backward 3.5 times the forward's two products (planner.cpp).
    hw.attention_efficiency = std::min(2.0, 3.5 * 4.0 * B * T * T * H * D / t / (hw.peak_tflops_fp32 * 1e12));
  }
  {
    // The memory-bound kernels of one block, forward and backward (2 layernorms, 2 residual adds and
    // their accumulates, GELU), at config M's shape; the bandwidth is the bytes the time model charges
    // for them (planner.cpp: 10X + 2F forward, twice that backward) over the time they really take.
    const int64_t N = 2048, C = 384;
    Tensor x = random_tensor(*be, {N, C}, DType::F32), y = be->empty({N, C}), dy = random_tensor(*be, {N, C}, DType::F32);
    Tensor gamma = random_tensor(*be, {C}, DType::F32, 1.f), beta = be->zeros({C}), dgamma = be->zeros({C}),
           dbeta = be->zeros({C}), mean = be->empty({N}), rstd = be->empty({N}), dx = be->empty({N, C});
    Tensor f = random_tensor(*be, {N, 4 * C}, DType::F32), g = be->empty({N, 4 * C}),
           df = random_tensor(*be, {N, 4 * C}, DType::F32), dg = be->empty({N, 4 * C});
    double t = best_seconds(8, [&] {
      for (int i = 0; i < 2; ++i) {
        be->layernorm_forward(x, gamma, beta, y, mean, rstd, 1e-5f);
        be->layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
        be->add(x, y, dx);
        be->accumulate(dy, dx);
      }
      be->gelu_forward(f, g);
      be->gelu_backward(df, f, dg);
    });
    const double X = N * C * 4.0, F = N * 4 * C * 4.0;
    hw.memory_bandwidth_gbs = (30 * X + 6 * F) / t / 1e9;
    hw.memory_efficiency = 1.0;
  }
  {
    // The cross-entropy forward and backward over config M's logits (one microbatch: 512 rows of a 50304
    // vocabulary, fp32), in the bytes the time model charges (5 passes of 4 bytes per logit).
    const int64_t N = 512, V = 50304;
    Tensor logits = random_tensor(*be, {N, V}, DType::F32, 4.f), targets = be->empty({N}, DType::I32);
    std::vector<int32_t> ids(N);
    for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 7919) % V);
    be->upload_i32(ids.data(), targets);
    Tensor row_max = be->empty({N}), sum_exp = be->empty({N}), target_logit = be->empty({N});
    Tensor loss = be->zeros({1}, DType::F64), dlogits = be->empty({N, V});
    double t = best_seconds(4, [&] {
      be->ce_row_max(logits, 0, V, row_max);
      be->ce_sum_exp(logits, row_max, targets, 0, V, sum_exp, target_logit);
      be->ce_loss_accumulate(row_max, sum_exp, target_logit, loss);
      be->ce_backward(logits, row_max, sum_exp, targets, 0, V, 1.f / N, dlogits);
    });
    hw.loss_bandwidth_gbs = 5 * 4.0 * N * V / t / 1e9;
  }
  {
    // One optimizer step over 8M fp32 parameters as the trainer runs it: the gradient's sum of squares,
    // AdamW over the flat buffers with the fp32 master copied to the weights, the gradient zeroed; in the
    // bytes the time model charges (48 + 4 per parameter in fp32).
    const int64_t P = int64_t(1) << 23;
    Tensor master = random_tensor(*be, {P}, DType::F32), grad = random_tensor(*be, {P}, DType::F32);
    Tensor m = be->zeros({P}), v = be->zeros({P}), value = be->empty({P}), sums = be->zeros({1}, DType::F64);
    const std::vector<ops::FlatSegment> segments = {{0, P, 0.1f, 0}};
    ops::AdamWHyper h;
    h.lr = 1e-4f;
    double t = best_seconds(4, [&] {
      be->sum_squares_segments(grad, segments, sums);
      be->adamw_step_flat(master, grad, m, v, &value, segments, h);
      be->fill(grad, 0.f);
    });
    hw.optimizer_bandwidth_gbs = 52.0 * P / t / 1e9;
  }
  {
    // Shared-memory MPI moves a message with two copies through a shared segment.
    const int64_t n = int64_t(1) << 24;
    Tensor a = random_tensor(*be, {n}, DType::F32), b = be->empty({n});
    double t = best_seconds(8, [&] { be->copy(a, b); });
    hw.intra_node_bandwidth_gbs = n * 4.0 / t / 2 / 1e9;
    hw.intra_node_efficiency = 1.0;
    hw.intra_node_latency_us = 2;
    hw.inter_node_bandwidth_gbs = hw.intra_node_bandwidth_gbs;  // one node: never used
    hw.inter_node_efficiency = 1.0;
    hw.inter_node_latency_us = 2;
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (meminfo >> key >> kb)
    if (key == "MemTotal:") break;
  hw.memory_gib = kb > 0 ? kb / 1024.0 / 1024.0 / devices_per_node : 1;
  hw.host_memory_is_device_memory = true;
  hw.memory_reserved_gib = std::min(1.0, hw.memory_gib / 4);
  hw.validate();
  return hw;
}

}  // namespace gpt
