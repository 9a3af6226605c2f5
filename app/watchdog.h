// No silent hangs. A rank that dies or stops responding leaves its peers blocked inside a collective
// forever unless something outside the collective notices. Three guards, all naming the rank that acts:
//  - MPI errors on MPI_COMM_WORLD go to a handler that prints the error with this rank and aborts the
//    job (the communicators of parallel/ already return errors, which become exceptions, and main()
//    aborts the job with the rank in the message);
//  - a watchdog thread aborts the job when the armed phase (one training step) makes no progress for
//    training.step_timeout_s seconds;
//  - the same thread exits when the launcher that started this process is gone (the parent process
//    changed), which otherwise leaves orphaned ranks spinning in MPI.
// Aborting means MPI_Abort (mpirun and srun then kill every rank), with a last-resort alarm so the
// process ends within a bounded time even if MPI_Abort itself cannot make progress.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace gpt {

// Exit status of a rank the watchdog ends.
constexpr int kWatchdogExitCode = 3;

class Watchdog {
 public:
  // Called once per expiry with the full message; the default prints it to stderr and aborts the job.
  using Action = std::function<void(const std::string& message)>;
  struct Options {
    int rank = 0;
    double step_timeout_s = 0;  // <= 0: steps are never timed out
    bool watch_parent = false;  // exit when the parent process (the launcher's daemon) goes away
    double poll_s = 1.0;        // how often the parent is checked
  };
  explicit Watchdog(Options options, Action on_expiry = abort_job);
  ~Watchdog();  // stops and joins the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts timing the phase `what` (e.g. "iteration 12"); disarm() or the next arm() ends it.
  void arm(std::string what);
  void disarm();
  double step_timeout_s() const { return options_.step_timeout_s; }

  // The default action: writes `message` to stderr, sets an alarm that ends the process if the abort
  // does not, and calls MPI_Abort(MPI_COMM_WORLD, kWatchdogExitCode) (or _exit when MPI is not running).
  static void abort_job(const std::string& message);

 private:
  void run();

  Options options_;
  Action on_expiry_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool armed_ = false;
  std::string phase_;
  std::chrono::steady_clock::time_point armed_at_;
  int parent_pid_ = 0;
  std::thread thread_;
};

// The process-wide watchdog the trainer arms (one per process, like the signal handlers): started by the
// train command, absent in tests that drive the trainer directly.
void start_process_watchdog(Watchdog::Options options);
void stop_process_watchdog();
Watchdog* process_watchdog();  // null when not started

// Arms the process watchdog (when there is one) for the lifetime of the scope.
class WatchdogScope {
 public:
  explicit WatchdogScope(const std::string& what);
  ~WatchdogScope();
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  Watchdog* dog_;
};

// Replaces MPI_COMM_WORLD's (and MPI_COMM_SELF's) fatal default error handler by one that prints
// "gpt-train: [rank R] MPI error in <communicator>: <MPI's message>" and aborts the job. Call after MPI_Init.
void install_mpi_error_handler(int rank);

}  // namespace gpt
