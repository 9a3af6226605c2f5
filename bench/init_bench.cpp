// init_bench: times the start-up weight initialisation of a config's whole model on the CPU backend (one
// rank, no tensor or pipeline parallelism: every global tensor is generated here) and prints an order-
// dependent checksum of every initialised value, so two builds can be compared for identical weights.
// Allocation (the zeroed value and gradient buffers) and initialisation are timed separately.
//
//   init_bench CONFIG [--set key=value ...]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>

#include "app/config.h"
#include "app/trainer.h"
#include "model/init.h"

int main(int argc, char** argv) {
  using namespace gpt;
  if (argc < 2) {
    std::fprintf(stderr, "usage: init_bench CONFIG [--set key=value ...]\n");
    return 2;
  }
  std::vector<std::string> overrides;
  for (int i = 2; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--set") == 0) overrides.push_back(argv[i + 1]);
  const Config cfg = load_config(argv[1], overrides);
  const ModelSpec spec = model_spec_from_config(cfg, 1, 0);
  auto backend = make_backend("cpu");
  ModelChunk chunk(spec, 0, spec.num_layers, true, true);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  chunk.params().allocate(*backend, spec.dtype);
  const auto t1 = Clock::now();
  for (auto& p : chunk.params().params()) init_parameter(*backend, *p, static_cast<uint64_t>(cfg.training.seed));
  const auto t2 = Clock::now();
  // Checksum: a hash chain over the bits of every value, read back as fp32, in parameter order.
  uint64_t sum = 0;
  int64_t elements = 0;
  std::vector<float> host;
  for (auto& p : chunk.params().params()) {
    host.resize(p->value.numel());
    backend->download(p->value, host.data());
    for (float x : host) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      sum = splitmix64(sum ^ bits);
    }
    elements += p->value.numel();
  }
  std::printf("init_bench: %lld elements (%s) in %zu tensors, %d OpenMP threads: allocate %.2f s, initialise %.2f s, "
              "checksum %016llx\n",
              static_cast<long long>(elements), dtype_name(spec.dtype), chunk.params().params().size(),
              omp_get_max_threads(), std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count(), static_cast<unsigned long long>(sum));
  return 0;
}
