// MetricsWriter: each line one flat JSON object built with nlohmann-json, keys in the order written.
// Numbers are written with the fewest digits that read back as the same double, so a float32 loss
// round-trips exactly; integers are exact; a value that is not finite (a diverged loss) is written as
// null, and a string that is not UTF-8 gets U+FFFD in place of its bad bytes.
#include "app/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gpt {
namespace {

std::string dump_line(const nlohmann::ordered_json& object) {
  return object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw std::runtime_error(fmt::format("metrics file {}: cannot create directory {}: {}", path, parent.string(), ec.message()));
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw std::runtime_error(fmt::format("metrics file {}: cannot open for appending: {}", path, std::strerror(errno)));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write_line(const std::string& json) {
  if (!file_) return;
  if (std::fputs((json + "\n").c_str(), file_) < 0 || std::fflush(file_) != 0)
    throw std::runtime_error(fmt::format("metrics file {}: write failed: {}", path_, std::strerror(errno)));
}

void MetricsWriter::write_iteration(const IterationStats& s) {
  if (!file_) return;
  nlohmann::ordered_json o = {{"event", "train"},
                              {"iteration", s.iteration},
                              {"train_iters", s.train_iters},
                              {"consumed_samples", s.consumed_samples},
                              {"loss", s.loss},
                              {"lr", s.lr},
                              {"grad_norm", s.grad_norm},
                              {"loss_scale", s.loss_scale},
                              {"tokens_per_s", s.tokens_per_s},
                              {"ms_per_iter", s.ms_per_iter},
                              {"global_batch_size", s.global_batch},
                              {"tflops_per_device", s.tflops_per_device},
                              {"skipped_iters", s.skipped_iters}};
  if (s.mfu >= 0) o["mfu"] = s.mfu;
  if (s.mem_in_use_bytes >= 0) o["mem_in_use_bytes"] = s.mem_in_use_bytes;
  if (s.mem_peak_bytes >= 0) o["mem_peak_bytes"] = s.mem_peak_bytes;
  write_line(dump_line(o));
}

void MetricsWriter::write_eval(int64_t iteration, const std::string& split, double loss, double perplexity) {
  if (!file_) return;
  write_line(dump_line(
      {{"event", "eval"}, {"iteration", iteration}, {"split", split}, {"loss", loss}, {"perplexity", perplexity}}));
}

}  // namespace gpt
