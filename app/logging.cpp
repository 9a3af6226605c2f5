// spdlog set-up for one rank (level, rank filter, pattern, colour only on a terminal) and the formatting of
// the per-iteration log line. Output goes to stdout and is flushed on every line, so interleaved mpirun output stays in order
// per rank and a killed run loses nothing it printed.
#include "app/logging.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace gpt {
namespace {

spdlog::level::level_enum parse_level(const std::string& name) {
  if (name == "warn" || name == "warning") return spdlog::level::warn;
  for (int l = spdlog::level::trace; l < spdlog::level::n_levels; ++l) {
    auto level = static_cast<spdlog::level::level_enum>(l);
    if (spdlog::level::to_string_view(level) == name) return level;
  }
  throw std::runtime_error(fmt::format(
      "logging.level: unknown log level '{}' (expected trace, debug, info, warn, error, critical or off)", name));
}

// TFLOP/s spans 1e-4 (a tiny CPU model) to 1e3 (a large GPU run): keep three significant digits.
std::string format_rate(double v) {
  if (v >= 100) return fmt::format("{:.0f}", v);
  if (v >= 1) return fmt::format("{:.2f}", v);
  return fmt::format("{:.3g}", v);
}

}  // namespace

bool log_colour_wanted(bool stdout_is_terminal, const char* no_color, const char* term, bool under_launcher) {
  if (no_color && *no_color) return false;  // https://no-color.org: any non-empty value
  if (term && std::string(term) == "dumb") return false;
  return stdout_is_terminal && !under_launcher;
}

void init_logging(int rank, const std::string& level, bool all_ranks, bool under_launcher) {
  spdlog::level::level_enum wanted = parse_level(level);
  if (rank != 0 && !all_ranks) wanted = std::max(wanted, spdlog::level::warn);
  // mpirun and srun hand each rank a pseudo-terminal even when the job's output goes to a file, so a rank
  // under a launcher cannot tell a person is watching: it never colours.
  const bool colour = log_colour_wanted(::isatty(STDOUT_FILENO) == 1, std::getenv("NO_COLOR"), std::getenv("TERM"),
                                        under_launcher);
  auto sink = std::make_shared<spdlog::sinks::stdout_color_sink_mt>(colour ? spdlog::color_mode::always
                                                                           : spdlog::color_mode::never);
  auto logger = std::make_shared<spdlog::logger>("gpt", sink);
  logger->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [rank {}] [%^%l%$] %v", rank));
  logger->set_level(wanted);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

std::string format_iteration_line(const IterationStats& s) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string line = fmt::format(" iteration {:8d}/{:8d} |", s.iteration, s.train_iters);
  line += fmt::format(" consumed samples: {} |", s.consumed_samples);
  line += fmt::format(" elapsed time per iteration (ms): {:.1f} |", s.ms_per_iter);
  line += fmt::format(" learning rate: {:.3E} |", s.lr);
  line += fmt::format(" global batch size: {} |", s.global_batch);
  line += fmt::format(" lm loss: {:.6E} |", s.loss);
  line += fmt::format(" loss scale: {:.1f} |", s.loss_scale);
  line += fmt::format(" grad norm: {:.3f} |", s.grad_norm);
  line += fmt::format(" tokens/s: {:.0f} |", s.tokens_per_s);
  line += fmt::format(" TFLOP/s/device: {} |", format_rate(s.tflops_per_device));
  if (s.mfu >= 0) line += fmt::format(" MFU: {:.1f}% |", 100.0 * s.mfu);
  if (s.mem_in_use_bytes >= 0 || s.mem_peak_bytes >= 0)
    line += fmt::format(" mem (MiB): {:.1f} in use, {:.1f} peak |", std::max<int64_t>(s.mem_in_use_bytes, 0) / kMiB,
                        std::max<int64_t>(s.mem_peak_bytes, 0) / kMiB);
  if (s.skipped_iters > 0) line += fmt::format(" skipped iterations: {} |", s.skipped_iters);
  return line;
}

}  // namespace gpt
