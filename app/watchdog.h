// No silent hangs. A rank that dies or stops responding leaves its peers blocked inside a collective
// forever unless something outside the collective notices. Three guards, all naming the rank that acts:
//  - MPI errors on MPI_COMM_WORLD go to a handler that prints the error with this rank and aborts the
//    job (the communicators of parallel/ already return errors, which become exceptions, and main()
//    aborts the job with the rank in the message);
//  - a watchdog thread aborts the job when the armed phase makes no progress in time: a training step or
//    an evaluation batch within training.step_timeout_s; start-up (data, model, resume) and a checkpoint
//    save or load within training.startup_timeout_s. Before aborting, rank 0 takes a census over MPI
//    (from the watchdog threads, on a communicator of their own): every rank whose watchdog still runs
//    reports its phase and whether it is waiting in communication or computing, so the message names the
//    stalled rank: one that does not answer (stopped, killed, hung in the kernel), or one that is still
//    computing while the others wait for it; with rank 0 itself silent, the others name rank 0;
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
    double poll_s = 1.0;        // how often the parent (and census messages) are checked
    double startup_timeout_s = 0;  // long phases (start-up, checkpoint I/O); <= 0: never timed out
    bool census = false;        // take the census over MPI before aborting (needs MPI_THREAD_MULTIPLE)
    double census_wait_s = 10;  // how long rank 0 waits for the census answers
  };
  // Which timeout a phase has.
  enum class Kind { Step, Long };
  // What is armed, saved by WatchdogScope so that a nested phase can hand the watch back.
  struct Phase {
    bool armed = false;
    std::string what;
    Kind kind = Kind::Step;
  };
  explicit Watchdog(Options options, Action on_expiry = abort_job);
  ~Watchdog();  // stops and joins the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts timing the phase `what` (e.g. "iteration 12"); disarm() or the next arm() ends it. Returns
  // the phase it replaces.
  Phase arm(std::string what, Kind kind = Kind::Step);
  void disarm();
  // Re-arms a saved phase (its clock starts again: the nested phase was progress) or disarms.
  void restore(const Phase& phase);
  double step_timeout_s() const { return options_.step_timeout_s; }
  int rank() const { return options_.rank; }

  // The default action: writes `message` to stderr, sets an alarm that ends the process if the abort
  // does not, and calls MPI_Abort(MPI_COMM_WORLD, kWatchdogExitCode) (or _exit when MPI is not running).
  static void abort_job(const std::string& message);

 private:
  void run();
  double timeout_s(Kind kind) const;
  // The census (watchdog thread only; called without mu_ held).
  // This rank's census line: "W" (waiting in communication) or "C" (computing), then the text.
  std::string census_status();
  void answer_census_requests();
  std::string take_census(const std::string& message);
  std::string await_verdict(const std::string& message);

  Options options_;
  Action on_expiry_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool armed_ = false;
  bool fired_ = false;  // the phase expired (and disarmed); it is still this rank's phase for the census
  std::string phase_;
  Kind kind_ = Kind::Step;
  std::chrono::steady_clock::time_point armed_at_;
  void* census_comm_ = nullptr;  // MPI_Comm of the census, owned
  int parent_pid_ = 0;
  std::thread thread_;
};

// The process-wide watchdog the trainer arms (one per process, like the signal handlers): started by the
// train command, absent in tests that drive the trainer directly.
void start_process_watchdog(Watchdog::Options options);
void stop_process_watchdog();
Watchdog* process_watchdog();  // null when not started

// Arms the process watchdog (when there is one) for the lifetime of the scope, then hands the watch back
// to the enclosing phase. For tests, GPT_TRAIN_FAULT_STALL="TEXT@RANK" (or "TEXT@RANK:spin") makes that
// rank stop itself with SIGSTOP (or spin, computing, with its watchdog running) on entering the first
// phase whose name contains TEXT.
class WatchdogScope {
 public:
  static constexpr Watchdog::Kind kStep = Watchdog::Kind::Step;
  static constexpr Watchdog::Kind kStartup = Watchdog::Kind::Long;
  explicit WatchdogScope(const std::string& what, Watchdog::Kind kind = kStep);
  ~WatchdogScope();
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  Watchdog* dog_;
  Watchdog::Phase previous_;
};

// Replaces MPI_COMM_WORLD's (and MPI_COMM_SELF's) fatal default error handler by one that prints
// "gpt-train: [rank R] MPI error in <communicator>: <MPI's message>" and aborts the job. Call after MPI_Init.
void install_mpi_error_handler(int rank);

}  // namespace gpt
