// Process-wide logging set-up (spdlog) and the human-readable training log line. Rank 0 logs at the
// configured level; other ranks log only warnings and errors unless every rank is asked to log, so an
// 8-rank run prints one progress stream but no rank's problem is hidden. Every line carries a timestamp
// and "[rank N]".
#pragma once
#include <cstdint>
#include <string>

namespace gpt {

// Sets the default spdlog logger. `level` is a spdlog level name (trace, debug, info, warn, error,
// critical, off); an unknown name throws std::runtime_error. Safe to call again (replaces the logger).
// `under_launcher`: started by mpirun, srun or another MPI launcher (app/launch_env.h).
void init_logging(int rank, const std::string& level, bool all_ranks, bool under_launcher);
// Whether log lines get ANSI colours: only when stdout is a terminal, NO_COLOR is unset or empty, TERM is
// not "dumb", and the process was not started by mpirun or srun.
bool log_colour_wanted(bool stdout_is_terminal, const char* no_color, const char* term, bool under_launcher);

// What one logged training iteration reports (the human log line and the metrics file share it).
struct IterationStats {
  int64_t iteration = 0;         // 1-based, the step just finished
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;  // samples seen so far, over all data-parallel ranks
  double ms_per_iter = 0;        // mean wall time per step since the last log line
  double lr = 0;
  int64_t global_batch = 0;
  double loss = 0;               // mean lm loss over the logged steps
  double loss_scale = 1;
  double grad_norm = 0;          // before clipping
  double tokens_per_s = 0;       // over all ranks
  double tflops_per_device = 0;  // model FLOPs (incl. recompute) / time / devices
  double mfu = -1;               // model FLOPs utilisation in [0, 1]; < 0 = not reported
  int64_t mem_in_use_bytes = -1;  // < 0 = not reported
  int64_t mem_peak_bytes = -1;
  int64_t skipped_iters = 0;     // steps skipped since the last log line (fp16 overflow)
};

// The Megatron-style line, e.g.
//  iteration       10/     100 | consumed samples: 80 | elapsed time per iteration (ms): 123.4 |
//  learning rate: 6.000E-04 | global batch size: 8 | lm loss: 5.432100E+00 | loss scale: 1.0 |
//  grad norm: 1.234 | tokens/s: 12345 | TFLOP/s/device: 0.12 | mem (MiB): 12.3 in use, 45.6 peak |
// (one line). MFU, memory and skipped iterations appear only when reported.
std::string format_iteration_line(const IterationStats& s);

}  // namespace gpt
