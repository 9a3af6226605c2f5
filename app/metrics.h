// The machine-readable metrics file: one JSON object per line, appended and flushed line by line so a
// crashed or still-running job can be read (tail -f, plotting scripts, tests). Written by rank 0 only.
//   {"event":"train","iteration":10,"loss":5.4321,"lr":0.0006,"grad_norm":1.23,"tokens_per_s":12345,...}
//   {"event":"eval","iteration":100,"split":"valid","loss":5.1,"perplexity":164.0}
// Non-finite numbers (a diverged loss) are written as null, which JSON can represent.
#pragma once
#include <cstdio>
#include <string>

#include "app/logging.h"

namespace gpt {

class MetricsWriter {
 public:
  // Empty path = disabled (every write is a no-op). Otherwise creates the parent directories and opens
  // `path` for appending; throws std::runtime_error naming the path when that fails.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  bool enabled() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }

  void write_iteration(const IterationStats& s);
  void write_eval(int64_t iteration, const std::string& split, double loss, double perplexity);

 private:
  void write_line(const std::string& json);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace gpt
