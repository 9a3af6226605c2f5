// gemm_peak: measures this machine's dense matrix-multiply peak as gpt-train reaches it, the yardstick the
// benchmark harness (bench/compare.py) divides achieved training FLOP/s by, next to PyTorch's matmul
// (bench/torch_gemm_peak.py). It times the CPU backend's product (model/ops/cpu/cpu_matmul.h, oneDNN's
// matmul) in fp32 and in bf16 (fp32 accumulation and output) on square row-major matrices of each
// requested size with --threads OpenMP threads, repeating each product until --min-seconds have passed,
// and reports the best repetition's rate (2 n^3 FLOPs per product) with the instruction set oneDNN picked.
//
//   gemm_peak [--threads K] [--sizes 1024,2048] [--min-seconds S] [--json]
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

#include <nlohmann/json.hpp>

#include <omp.h>

#include "model/ops/cpu/cpu_matmul.h"

namespace gpt {
namespace {

struct Options {
  int threads = 0;  // 0: OpenMP's default (OMP_NUM_THREADS or the core count)
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

// One square product n x n x n of operand type `t` (C fp32).
double product_rate(int64_t n, cpu::MatType t, const std::vector<float>& a, const std::vector<float>& b,
                    std::vector<float>& c, double min_seconds) {
  cpu::MatmulShape s;
  s.M = s.N = s.K = n;
  s.lda = s.ldb = s.ldc = n;
  s.a = s.b = t;
  std::vector<uint16_t> a16, b16;
  const void *pa = a.data(), *pb = b.data();
  if (t == cpu::MatType::BF16) {
    a16.resize(a.size()), b16.resize(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(a[i]), b16[i] = to_bf16(b[i]);
    pa = a16.data(), pb = b16.data();
  }
  return best_rate([&] { cpu::matmul(s, pa, pb, c.data()); }, 2.0 * double(n) * double(n) * double(n), min_seconds);
}

int run(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const int threads = omp_get_max_threads();
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  double f32_peak = 0, bf16_peak = 0;
  nlohmann::ordered_json per_size = nlohmann::ordered_json::array();
  for (int64_t n : o.sizes) {
    std::vector<float> a(n * n), b(n * n), c(n * n, 0.f);
    for (auto& x : a) x = dist(rng);
    for (auto& x : b) x = dist(rng);
    const double f32 = product_rate(n, cpu::MatType::F32, a, b, c, o.min_seconds);
    const double bf16 = product_rate(n, cpu::MatType::BF16, a, b, c, o.min_seconds);
    f32_peak = std::max(f32_peak, f32);
    bf16_peak = std::max(bf16_peak, bf16);
    if (!o.json) std::printf("n=%lld: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s\n", (long long)n, f32, bf16);
    per_size.push_back({{"n", n}, {"gpt_train_f32", f32}, {"gpt_train_bf16", bf16}});
  }
  const std::string isa = cpu::matmul_isa(), lib = cpu::matmul_library_version();
  if (o.json) {
    const nlohmann::ordered_json out = {{"impl", "onednn"},
                                        {"library", lib},
                                        {"isa", isa},
                                        {"threads", threads},
                                        {"gpt_train_f32_gflops", f32_peak},
                                        {"gpt_train_bf16_gflops", bf16_peak},
                                        {"sizes", per_size}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%s (ISA %s), %d threads: peak fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s\n", lib.c_str(), isa.c_str(),
                threads, f32_peak, bf16_peak);
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
