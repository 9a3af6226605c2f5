// gemm_peak: measures this machine's dense matrix-multiply peak, the yardstick the benchmark harness
// (bench/compare.py) divides achieved training FLOP/s by. It times OpenBLAS cblas_sgemm (fp32) and
// cblas_sbgemm (bf16 inputs, fp32 accumulation and output) on square row-major matrices of each requested
// size with OpenBLAS's own thread pool set to --threads, repeating each product until --min-seconds have
// passed, and reports the best repetition's rate (2 n^3 FLOPs per product). cblas_sbgemm is looked up at
// run time because OpenBLAS builds without BUILD_BFLOAT16 (Debian's 0.3.21 among them) do not export it;
// then sbgemm is reported as null and the harness takes the bf16 peak from PyTorch's bf16 matmul instead.
// It also times gpt-train's own bf16 GEMM (model/ops/cpu/cpu_gemm.h, AVX512-BF16) on the same
// matrices with --threads OpenMP threads, reported as "gpt_train_bf16"; null where the CPU lacks it.
// The OpenBLAS result is only meaningful
// for the OpenBLAS kernel family that was selected at load time (printed as "core", see
// OPENBLAS_CORETYPE), so the harness runs it under the same environment as the training runs.
//
//   gemm_peak [--threads K] [--sizes 1024,2048] [--min-seconds S] [--json]
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <omp.h>

#include "model/ops/cpu/cpu_gemm.h"

extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);

namespace {
using SbgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                          const bfloat16*, blasint, const bfloat16*, blasint, float, float*, blasint);
}

namespace gpt {
namespace {

struct Options {
  int threads = 0;  // 0: leave OpenBLAS's default (OPENBLAS_NUM_THREADS or the core count)
  std::vector<int64_t> sizes{1024, 2048};
  double min_seconds = 1.0;
  bool json = false;
};

int64_t parse_int(const std::string& text, const char* flag) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || v <= 0)
    throw std::runtime_error(std::string("gemm_peak: ") + flag + " needs a positive integer, got '" + text + "'");
  return v;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(std::string("gemm_peak: ") + flag + " needs a value");
      return argv[++i];
    };
    if (arg == "--threads") {
      o.threads = static_cast<int>(parse_int(value("--threads"), "--threads"));
    } else if (arg == "--sizes") {
      o.sizes.clear();
      std::stringstream list(value("--sizes"));
      for (std::string item; std::getline(list, item, ',');) o.sizes.push_back(parse_int(item, "--sizes"));
    } else if (arg == "--min-seconds") {
      std::string text = value("--min-seconds");
      char* end = nullptr;
      o.min_seconds = std::strtod(text.c_str(), &end);
      if (!end || *end || !(o.min_seconds > 0))
        throw std::runtime_error("gemm_peak: --min-seconds needs a positive number, got '" + text + "'");
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg == "--help" || arg == "-h") {
      std::puts("gemm_peak [--threads K] [--sizes 1024,2048] [--min-seconds S] [--json]");
      std::exit(0);
    } else {
      throw std::runtime_error("gemm_peak: unknown argument '" + arg + "' (see --help)");
    }
  }
  return o;
}

// Round-to-nearest-even fp32 -> bf16 (inputs are finite random numbers, so no NaN handling is needed).
uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

std::string rate(double gflops) {
  if (gflops < 0) return "n/a (no cblas_sbgemm in this OpenBLAS)";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", gflops);
  return text;
}

std::string json_rate(double gflops) {
  if (gflops < 0) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", gflops);
  return text;
}

// Runs `product` once untimed, then until min_seconds have passed (at least 3 times); returns the best
// repetition's GFLOP/s for `flops` per call.
template <class F>
double best_rate(F&& product, double flops, double min_seconds) {
  product();
  double best = 0, total = 0;
  for (int rep = 0; rep < 3 || total < min_seconds; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    product();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total += s;
    best = std::max(best, flops / s / 1e9);
  }
  return best;
}

int run(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  if (o.threads > 0) openblas_set_num_threads(o.threads);
  const int threads = openblas_get_num_threads();
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);

  const auto sbgemm = reinterpret_cast<SbgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const bool own_bf16 = cpu::bf16_gemm_available(), own_f32 = cpu::f32_gemm_available();
  double sgemm_peak = 0, sbgemm_peak = 0, own_peak = 0, own_f32_peak = 0;
  std::string per_size;
  for (int64_t n : o.sizes) {
    std::vector<float> a(n * n), b(n * n), c(n * n, 0.f);
    for (auto& x : a) x = dist(rng);
    for (auto& x : b) x = dist(rng);
    const double flops = 2.0 * double(n) * double(n) * double(n);
    const int bn = static_cast<int>(n);
    double s = best_rate([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bn, bn, bn, 1.f, a.data(), bn, b.data(), bn, 0.f,
                  c.data(), bn);
    }, flops, o.min_seconds);
    double sb = -1, own = -1, own32 = -1;  // negative: not measured
    if (own_f32) {
      own32 = best_rate([&] {
        cpu::parallel_gemm_f32(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
      }, flops, o.min_seconds);
    }
    std::vector<uint16_t> a16(n * n), b16(n * n);
    for (int64_t i = 0; i < n * n; ++i) a16[i] = to_bf16(a[i]), b16[i] = to_bf16(b[i]);
    if (own_bf16) {
      own = best_rate([&] {
        cpu::parallel_gemm_bf16(false, false, n, n, n, 1.f, a16.data(), n, b16.data(), n, 0.f, c.data(), n);
      }, flops, o.min_seconds);
    }
    if (sbgemm) {
      sb = best_rate([&] {
        sbgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bn, bn, bn, 1.f,
               reinterpret_cast<const bfloat16*>(a16.data()), bn, reinterpret_cast<const bfloat16*>(b16.data()), bn,
               0.f, c.data(), bn);
      }, flops, o.min_seconds);
    }
    sgemm_peak = std::max(sgemm_peak, s);
    sbgemm_peak = std::max(sbgemm_peak, sb);
    own_peak = std::max(own_peak, own);
    own_f32_peak = std::max(own_f32_peak, own32);
    if (!o.json)
      std::printf("n=%lld: sgemm %.1f GFLOP/s, sbgemm %s GFLOP/s, gpt-train fp32 %s GFLOP/s, gpt-train bf16 %s GFLOP/s\n",
                  (long long)n, s, rate(sb).c_str(), own32 < 0 ? "n/a (no AVX-512)" : rate(own32).c_str(),
                  own < 0 ? "n/a (no AVX512-BF16)" : rate(own).c_str());
    char item[200];
    std::snprintf(item, sizeof item,
                  "%s{\"n\":%lld,\"sgemm\":%.2f,\"sbgemm\":%s,\"gpt_train_f32\":%s,\"gpt_train_bf16\":%s}",
                  per_size.empty() ? "" : ",", (long long)n, s, json_rate(sb).c_str(), json_rate(own32).c_str(),
                  json_rate(own).c_str());
    per_size += item;
  }
  if (o.json) {
    std::printf("{\"impl\":\"openblas\",\"core\":\"%s\",\"threads\":%d,\"sgemm_gflops\":%.2f,"
                "\"sbgemm_gflops\":%s,\"gpt_train_f32_gflops\":%s,\"gpt_train_bf16_gflops\":%s,\"sizes\":[%s]}\n",
                openblas_get_corename(), threads, sgemm_peak, json_rate(sbgemm ? sbgemm_peak : -1).c_str(),
                json_rate(own_f32 ? own_f32_peak : -1).c_str(), json_rate(own_bf16 ? own_peak : -1).c_str(),
                per_size.c_str());
  } else {
    std::printf("OpenBLAS core %s, %d threads: peak sgemm %.1f GFLOP/s, sbgemm %s GFLOP/s, gpt-train fp32 %s, "
                "gpt-train bf16 %s\n",
                openblas_get_corename(), threads, sgemm_peak, rate(sbgemm ? sbgemm_peak : -1).c_str(),
                own_f32 ? rate(own_f32_peak).c_str() : "n/a", own_bf16 ? rate(own_peak).c_str() : "n/a");
  }
  return 0;
}

}  // namespace
}  // namespace gpt

int main(int argc, char** argv) {
  try {
    return gpt::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
