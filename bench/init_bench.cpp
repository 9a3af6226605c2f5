// init_bench: times the start-up weight initialisation of a config's whole model on the CPU backend (one
// rank, no tensor or pipeline parallelism: every global tensor is generated here) and prints an order-
// dependent checksum of every initialised value, so two builds or two methods can be compared for
// identical weights. Allocation (the zeroed value and gradient buffers) and initialisation are timed
// separately. --reference fills the values the way initialisation did before it was parallel (one thread,
// the stream key and the shard index arithmetic redone for every element), for the comparison.
//
//   init_bench CONFIG [--reference] [--set key=value ...]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>

#include "app/config_model.h"
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
  bool reference = false;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reference") == 0) reference = true;
    else if (std::strcmp(argv[i], "--set") == 0 && i + 1 < argc) overrides.push_back(argv[++i]);
  }
  const Config cfg = load_config(argv[1], overrides);
  const ModelSpec spec = model_spec_from_config(cfg, 1, 0);
  auto backend = make_backend("cpu");
  ModelChunk chunk(spec, 0, spec.num_layers, true, true);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  chunk.params().allocate(*backend, spec.dtype);
  const auto t1 = Clock::now();
  const uint64_t seed = static_cast<uint64_t>(cfg.training.seed);
  for (auto& p : chunk.params().params()) {
    if (!reference) {
      init_parameter(*backend, *p, seed);
      continue;
    }
    std::vector<float> host(p->value.numel());
    const uint64_t h = hash_name(p->name);
    for (int64_t i = 0; i < (int64_t)host.size(); ++i)
      host[i] = p->init.normal ? p->init.std * counter_normal(seed, h, p->shard.global_index(p->global_shape, i))
                               : p->init.constant;
    backend->upload(host.data(), p->value);
  }
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
  std::printf("init_bench%s: %lld elements (%s) in %zu tensors, %d OpenMP threads: allocate %.2f s, "
              "initialise %.2f s, checksum %016llx\n",
              reference ? " (single-threaded reference)" : "", static_cast<long long>(elements),
              dtype_name(spec.dtype), chunk.params().params().size(), reference ? 1 : omp_get_max_threads(),
              std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count(),
              static_cast<unsigned long long>(sum));
  return 0;
}
