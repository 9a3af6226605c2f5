// Start-up checks (see startup_checks.h): config agreement over the ranks and an early open of the data.
#include "app/startup_checks.h"

#include <fmt/format.h>

#include <map>
#include <vector>

#include "app/commands.h"
#include "app/trainer.h"
#include "parallel/checkpoint/checkpoint_format.h"
#include "parallel/comm/host_messages.h"

namespace gpt {

std::string config_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

void require_same_config(Communicator& world, const Config& cfg) {
  const std::string dump = dump_config(cfg);
  const std::vector<std::string> hashes = all_gather_strings(world, config_hash(dump));
  std::vector<int> differ;
  for (int r = 1; r < world.size(); ++r)
    if (hashes[r] != hashes[0]) differ.push_back(r);
  if (differ.empty()) return;
  // Rank 0 and the first differing rank's configs, key by key.
  const std::string base = broadcast_string(world, dump, 0), other = broadcast_string(world, dump, differ.front());
  const auto a = flatten_yaml(base, "rank 0's config"), b = flatten_yaml(other, "another rank's config");
  std::string keys;
  int shown = 0;
  std::map<std::string, std::string> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  for (const auto& [key, unused] : all) {
    auto x = a.find(key), y = b.find(key);
    const std::string va = x == a.end() ? "(absent)" : x->second, vb = y == b.end() ? "(absent)" : y->second;
    if (va == vb) continue;
    if (++shown <= 8) keys += fmt::format("\n  {}: rank 0 {}, rank {} {}", key, va, differ.front(), vb);
  }
  if (shown > 8) keys += fmt::format("\n  ... and {} more", shown - 8);
  std::string ranks;
  for (size_t i = 0; i < differ.size() && i < 16; ++i) ranks += (i ? ", " : "") + std::to_string(differ[i]);
  if (differ.size() > 16) ranks += fmt::format(", ... ({} ranks)", differ.size());
  throw StartupError(fmt::format("the ranks were started with different configs: rank{} {} differ{} from rank 0 "
                                 "(config hash {} against {}); every rank must run the same config:{}",
                                 differ.size() > 1 ? "s" : "", ranks, differ.size() > 1 ? "" : "s",
                                 hashes[differ.front()], hashes[0], keys));
}

void check_validation_data_at_startup(Communicator& world, const Config& cfg, bool train) {
  std::string error;
  if (!train || cfg.eval.interval > 0 || !cfg.data.valid.empty()) {
    try {
      make_sample_source(cfg, "valid");
    } catch (const std::exception& e) {
      error = fmt::format("config {}: {}: {}", cfg.source,
                          cfg.data.valid.empty() ? "data.split (the validation split of data.train)" : "data.valid",
                          e.what());
    }
  }
  agree_or_throw<StartupError>(world, error);
}

}  // namespace gpt
