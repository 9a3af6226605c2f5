// MetricsWriter: JSON lines written by hand (the format is a handful of flat objects, not worth a
// dependency). Numbers use %.9g, enough to round-trip a float32 loss exactly; integers are exact.
#include "app/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

namespace gpt {
namespace {

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", v);
  return buffer;
}

// Builds one flat JSON object field by field.
class JsonObject {
 public:
  JsonObject& add_raw(const char* key, const std::string& raw_value) {
    text_ += text_.empty() ? "{" : ",";
    text_ += json_string(key) + ":" + raw_value;
    return *this;
  }
  JsonObject& add(const char* key, int64_t v) { return add_raw(key, std::to_string(v)); }
  JsonObject& add(const char* key, double v) { return add_raw(key, json_number(v)); }
  JsonObject& add_string(const char* key, const std::string& v) { return add_raw(key, json_string(v)); }
  std::string str() const { return text_.empty() ? "{}" : text_ + "}"; }

 private:
  std::string text_;
};

}  // namespace

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char ch : text) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) out += fmt::format("\\u{:04x}", ch);
        else out += static_cast<char>(ch);  // UTF-8 bytes pass through unchanged
    }
  }
  return out + "\"";
}

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
  JsonObject o;
  o.add_string("event", "train")
      .add("iteration", s.iteration)
      .add("train_iters", s.train_iters)
      .add("consumed_samples", s.consumed_samples)
      .add("loss", s.loss)
      .add("lr", s.lr)
      .add("grad_norm", s.grad_norm)
      .add("loss_scale", s.loss_scale)
      .add("tokens_per_s", s.tokens_per_s)
      .add("ms_per_iter", s.ms_per_iter)
      .add("global_batch_size", s.global_batch)
      .add("tflops_per_device", s.tflops_per_device)
      .add("skipped_iters", s.skipped_iters);
  if (s.mfu >= 0) o.add("mfu", s.mfu);
  if (s.mem_in_use_bytes >= 0) o.add("mem_in_use_bytes", s.mem_in_use_bytes);
  if (s.mem_peak_bytes >= 0) o.add("mem_peak_bytes", s.mem_peak_bytes);
  write_line(o.str());
}

void MetricsWriter::write_eval(int64_t iteration, const std::string& split, double loss, double perplexity) {
  if (!file_) return;
  JsonObject o;
  o.add_string("event", "eval").add("iteration", iteration).add_string("split", split).add("loss", loss).add(
      "perplexity", perplexity);
  write_line(o.str());
}

}  // namespace gpt
