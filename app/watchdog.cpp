// The watchdog thread (step timeout, launcher gone), the process-wide instance the trainer arms, and the
// MPI_COMM_WORLD error handler that names the rank before aborting.
#include "app/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

namespace gpt {

namespace {

// How long MPI_Abort gets before the alarm ends the process anyway.
constexpr unsigned kAbortGraceSeconds = 10;

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace

Watchdog::Watchdog(Options options, Action on_expiry)
    : options_(options), on_expiry_(std::move(on_expiry)), parent_pid_(static_cast<int>(getppid())) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::arm(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = std::move(what);
  armed_ = true;
  armed_at_ = std::chrono::steady_clock::now();
  // The thread re-reads the deadline when it next wakes; no notify needed, since a new deadline is
  // never earlier than one it is already waiting for (it waits at most poll_s either way).
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

void Watchdog::run() {
  using clock = std::chrono::steady_clock;
  const auto poll = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(options_.poll_s));
  const auto timeout =
      std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(options_.step_timeout_s));
  bool parent_reported = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    auto wake = clock::now() + poll;
    if (armed_ && options_.step_timeout_s > 0) wake = std::min(wake, armed_at_ + timeout);
    cv_.wait_until(lock, wake, [this] { return stopping_; });
    if (stopping_) break;

    std::string message;
    const auto now = clock::now();
    if (armed_ && options_.step_timeout_s > 0 && now >= armed_at_ + timeout) {
      const double waited = std::chrono::duration<double>(now - armed_at_).count();
      message = fmt::format(
          "gpt-train: [rank {}] watchdog: {} has made no progress for {:.1f} s (training.step_timeout_s = {:g}); "
          "another rank is probably dead or stuck and this one is waiting for it; aborting the job",
          options_.rank, phase_, waited, options_.step_timeout_s);
      armed_ = false;  // fires once per arm
    } else if (options_.watch_parent && !parent_reported && static_cast<int>(getppid()) != parent_pid_) {
      message = fmt::format(
          "gpt-train: [rank {}] watchdog: the launcher process that started this rank (pid {}) is gone; "
          "exiting instead of waiting for peers that will never answer",
          options_.rank, parent_pid_);
      parent_reported = true;
    }
    if (!message.empty()) {
      lock.unlock();
      on_expiry_(message);
      lock.lock();
    }
  }
}

void Watchdog::abort_job(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  // If MPI_Abort cannot reach the launcher (it may be the thing that died), the alarm's default action
  // ends this process anyway.
  std::signal(SIGALRM, SIG_DFL);
  alarm(kAbortGraceSeconds);
  if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, kWatchdogExitCode);
  _exit(kWatchdogExitCode);
}

// ---- the process-wide instance ----

namespace {
std::mutex g_process_mu;
std::unique_ptr<Watchdog> g_process_watchdog;
}  // namespace

void start_process_watchdog(Watchdog::Options options) {
  std::lock_guard<std::mutex> lock(g_process_mu);
  g_process_watchdog.reset();
  g_process_watchdog = std::make_unique<Watchdog>(options);
}

void stop_process_watchdog() {
  std::lock_guard<std::mutex> lock(g_process_mu);
  g_process_watchdog.reset();
}

Watchdog* process_watchdog() {
  std::lock_guard<std::mutex> lock(g_process_mu);
  return g_process_watchdog.get();
}

WatchdogScope::WatchdogScope(const std::string& what) : dog_(process_watchdog()) {
  if (dog_) dog_->arm(what);
}

WatchdogScope::~WatchdogScope() {
  if (dog_) dog_->disarm();
}

// ---- MPI error handler ----

namespace {

int g_error_rank = 0;

void report_mpi_error(MPI_Comm* comm, int* code, ...) {
  char error[MPI_MAX_ERROR_STRING] = {0}, name[MPI_MAX_OBJECT_NAME] = {0};
  int len = 0;
  MPI_Error_string(*code, error, &len);
  MPI_Comm_get_name(*comm, name, &len);
  std::fprintf(stderr, "gpt-train: [rank %d] MPI error on %s: %s; aborting the job\n", g_error_rank,
               name[0] ? name : "a communicator", error);
  std::fflush(stderr);
  std::signal(SIGALRM, SIG_DFL);
  alarm(kAbortGraceSeconds);
  MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);
}

}  // namespace

void install_mpi_error_handler(int rank) {
  g_error_rank = rank;
  MPI_Errhandler handler;
  MPI_Comm_create_errhandler(report_mpi_error, &handler);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, handler);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, handler);
  MPI_Errhandler_free(&handler);  // the communicators keep their own reference
}

}  // namespace gpt
