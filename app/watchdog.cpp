// The watchdog thread (step timeout, launcher gone), the process-wide instance the trainer arms, and the
// MPI_COMM_WORLD error handler that names the rank before aborting.
#include "app/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "model/communicator.h"

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

// Census messages on the watchdog's own communicator.
constexpr int kTagExpired = 1;  // a rank's phase expired: rank -> 0, with that rank's message
constexpr int kTagRequest = 2;  // rank 0 asks for every rank's status: 0 -> rank, empty
constexpr int kTagStatus = 3;   // the answer: rank -> 0, "W" (waiting in communication) or "C" + a line
constexpr int kTagVerdict = 4;  // rank 0's conclusion: 0 -> rank
constexpr int kMaxMessage = 4096;

MPI_Comm census_comm(void* p) { return *static_cast<MPI_Comm*>(p); }

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// Receives a pending message with `tag` from `source` (MPI_ANY_SOURCE allowed), if one has arrived.
bool receive_if_there(MPI_Comm comm, int source, int tag, std::string& text) {
  int flag = 0;
  MPI_Status status;
  MPI_Iprobe(source, tag, comm, &flag, &status);
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_CHAR, &count);
  text.assign(static_cast<size_t>(std::max(count, 0)), '\0');
  MPI_Recv(text.data(), count, MPI_CHAR, status.MPI_SOURCE, tag, comm, MPI_STATUS_IGNORE);
  return true;
}

// Sends without blocking for long: a peer that never receives must not hang the census. The buffer
// outlives a send that did not complete in time (the process is about to abort anyway).
void send_bounded(MPI_Comm comm, const std::string& text, int dest, int tag, double wait_s) {
  MPI_Request request;
  auto* buffer = new std::string(text.substr(0, kMaxMessage));
  if (MPI_Isend(buffer->data(), static_cast<int>(buffer->size()), MPI_CHAR, dest, tag, comm, &request) != MPI_SUCCESS) {
    delete buffer;
    return;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < until) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) sleep_s(0.01);
  }
  if (done) delete buffer;
  else MPI_Request_free(&request);  // `buffer` is left to the process's end
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

Watchdog::Watchdog(Options options, Action on_expiry)
    : options_(options), on_expiry_(std::move(on_expiry)), parent_pid_(static_cast<int>(getppid())) {
  if (options_.census && mpi_running()) {
    int provided = 0, size = 1;
    MPI_Query_thread(&provided);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (provided == MPI_THREAD_MULTIPLE && size > 1) {
      auto* comm = new MPI_Comm;
      MPI_Comm_dup(MPI_COMM_WORLD, comm);  // collective: every rank starts its watchdog at the same point
      MPI_Comm_set_name(*comm, "watchdog census");
      // Errors (a dead peer) come back as codes and count as silence; the world's handler would abort
      // before the verdict is printed.
      MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN);
      census_comm_ = comm;
    }
  }
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // The census communicator is left to MPI_Finalize: freeing it is collective, and a peer may be gone.
  delete static_cast<MPI_Comm*>(census_comm_);
}

Watchdog::Phase Watchdog::arm(std::string what, Kind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  Phase previous{armed_, phase_, kind_};
  phase_ = std::move(what);
  kind_ = kind;
  armed_ = true;
  fired_ = false;
  armed_at_ = std::chrono::steady_clock::now();
  // The thread re-reads the deadline when it next wakes; no notify needed, since it waits at most
  // poll_s, and a deadline shorter than that fires at most poll_s late.
  return previous;
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = fired_ = false;
}

void Watchdog::restore(const Phase& phase) {
  if (!phase.armed) return disarm();
  arm(phase.what, phase.kind);
}

double Watchdog::timeout_s(Kind kind) const {
  return kind == Kind::Step ? options_.step_timeout_s : options_.startup_timeout_s;
}

std::string Watchdog::census_status() {
  std::string phase;
  double waited = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (armed_ || fired_)  // the phase in progress, or the one that has just expired
      phase = phase_, waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - armed_at_).count();
  }
  const std::string group = CommunicationMarker::current();
  const std::string where = phase.empty() ? "between timed phases" : fmt::format("in {} for {:.0f} s", phase, waited);
  if (!group.empty()) return fmt::format("Wrank {}: {}, waiting in communication ({} group)", options_.rank, where, group);
  return fmt::format("Crank {}: {}, computing (in no communication call)", options_.rank, where);
}

// Answers rank 0's census request, if one came (lock not held).
void Watchdog::answer_census_requests() {
  const MPI_Comm comm = census_comm(census_comm_);
  std::string ignored;
  if (!receive_if_there(comm, 0, kTagRequest, ignored)) return;
  send_bounded(comm, census_status(), 0, kTagStatus, 2.0);
}

// Rank 0: asks every rank for its status, names the stalled ones, tells the others (lock not held).
std::string Watchdog::take_census(const std::string& message) {
  const MPI_Comm comm = census_comm(census_comm_);
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<MPI_Request> requests(size, MPI_REQUEST_NULL);
  // Receive buffers live until the process ends: a cancelled receive may still complete late.
  auto& buffers = *new std::vector<std::vector<char>>(size, std::vector<char>(kMaxMessage));
  std::vector<std::string> statuses(size);
  for (int r = 1; r < size; ++r) {
    MPI_Request send;
    if (MPI_Isend(nullptr, 0, MPI_CHAR, r, kTagRequest, comm, &send) == MPI_SUCCESS) MPI_Request_free(&send);
    MPI_Irecv(buffers[r].data(), kMaxMessage, MPI_CHAR, r, kTagStatus, comm, &requests[r]);
  }
  statuses[0] = census_status();
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.census_wait_s);
  int answered = 1;
  while (answered < size && std::chrono::steady_clock::now() < until) {
    for (int r = 1; r < size; ++r) {
      if (requests[r] == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_Status st;
      MPI_Test(&requests[r], &done, &st);
      if (!done) continue;
      int count = 0;
      MPI_Get_count(&st, MPI_CHAR, &count);
      statuses[r].assign(buffers[r].data(), static_cast<size_t>(std::max(count, 0)));
      ++answered;
    }
    if (answered < size) sleep_s(0.02);
  }
  std::vector<int> silent, computing, waiting;
  for (int r = 0; r < size; ++r) {
    if (statuses[r].empty()) silent.push_back(r);
    else (statuses[r][0] == 'C' ? computing : waiting).push_back(r);
  }
  for (int r = 1; r < size; ++r)
    if (requests[r] != MPI_REQUEST_NULL) MPI_Cancel(&requests[r]), MPI_Request_free(&requests[r]);
  std::string verdict;
  if (!silent.empty())
    verdict = fmt::format("{} stalled: no answer to the watchdog census within {:g} s (stopped, killed, or hung where "
                          "even its watchdog cannot run)",
                          rank_list(silent), options_.census_wait_s);
  else if (!computing.empty() && !waiting.empty())
    verdict = fmt::format("{} stalled: still computing while the other ranks wait for it in communication",
                          rank_list(computing));
  else if (computing.empty())
    verdict = "every rank is waiting in communication: the ranks disagree about what comes next (a deadlock)";
  else
    verdict = "every rank answered and none waits in an MPI call: the phase is slower than its timeout, or (on a "
              "device backend, where a wait for a peer happens on the device) a device collective is stuck";
  std::string full = message + "\n  census: " + verdict;
  for (int r = 0; r < size; ++r)
    if (!statuses[r].empty()) full += "\n    " + statuses[r].substr(1);
  for (int r = 1; r < size; ++r)
    if (!statuses[r].empty()) send_bounded(comm, verdict, r, kTagVerdict, 2.0);
  return full + "\n  aborting the job";
}

// Any rank but 0: reports the expiry to rank 0 and waits for its verdict, answering its census meanwhile
// (lock not held).
std::string Watchdog::await_verdict(const std::string& message) {
  const MPI_Comm comm = census_comm(census_comm_);
  send_bounded(comm, message, 0, kTagExpired, 0.5);
  const double wait_s = options_.census_wait_s + 2 * options_.poll_s + 5;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  std::string verdict;
  while (std::chrono::steady_clock::now() < until) {
    answer_census_requests();
    if (receive_if_there(comm, 0, kTagVerdict, verdict)) return message + "\n  rank 0's census: " + verdict;
    sleep_s(0.05);
  }
  return message + fmt::format("\n  census: rank 0 stalled: it did not answer within {:.0f} s (stopped, killed, or hung "
                               "where even its watchdog cannot run)",
                               wait_s);
}

void Watchdog::run() {
  using clock = std::chrono::steady_clock;
  const auto poll = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(options_.poll_s));
  auto seconds = [](double s) { return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(s)); };
  bool parent_reported = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const double timeout = timeout_s(kind_);
    auto wake = clock::now() + poll;
    if (armed_ && timeout > 0) wake = std::min(wake, armed_at_ + seconds(timeout));
    cv_.wait_until(lock, wake, [this] { return stopping_; });
    if (stopping_) break;

    std::string message, peer_message;
    bool expired = false;
    const auto now = clock::now();
    const double limit = timeout_s(kind_);
    if (armed_ && limit > 0 && now >= armed_at_ + seconds(limit)) {
      const double waited = std::chrono::duration<double>(now - armed_at_).count();
      const std::string group = CommunicationMarker::current();
      message = fmt::format(
          "gpt-train: [rank {}] watchdog: {} has made no progress for {:.1f} s ({} = {:g}); this rank is {}",
          options_.rank, phase_, waited,
          kind_ == Kind::Step ? "training.step_timeout_s" : "training.startup_timeout_s", limit,
          group.empty() ? "computing, in no communication call: it is the stalled rank"
                        : "waiting in communication (" + group + " group) for a rank that is dead or stuck");
      armed_ = false;  // fires once per arm
      fired_ = true;
      expired = true;
    } else if (options_.watch_parent && !parent_reported && static_cast<int>(getppid()) != parent_pid_) {
      message = fmt::format(
          "gpt-train: [rank {}] watchdog: the launcher process that started this rank (pid {}) is gone; "
          "exiting instead of waiting for peers that will never answer",
          options_.rank, parent_pid_);
      parent_reported = true;
    }
    lock.unlock();
    if (census_comm_) {
      answer_census_requests();
      // Rank 0 takes the census as soon as any rank reports an expiry, even before its own phase expires.
      if (options_.rank == 0 && message.empty()) {
        if (receive_if_there(census_comm(census_comm_), MPI_ANY_SOURCE, kTagExpired, peer_message))
          message = take_census(peer_message);
      } else if (expired) {
        message = options_.rank == 0 ? take_census(message) : await_verdict(message);
      }
    }
    if (!message.empty()) on_expiry_(message);
    lock.lock();
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

namespace {

// GPT_TRAIN_FAULT_STALL="TEXT@RANK[:spin]": the test hook described in watchdog.h.
void maybe_stall(const std::string& phase, int rank) {
  static std::once_flag parsed;
  static std::string text;
  static int stall_rank = -1;
  static bool spin = false, fired = false;
  std::call_once(parsed, [] {
    const char* env = std::getenv("GPT_TRAIN_FAULT_STALL");
    if (!env) return;
    std::string spec = env;
    if (spec.size() > 5 && spec.compare(spec.size() - 5, 5, ":spin") == 0) spin = true, spec.resize(spec.size() - 5);
    const size_t at = spec.rfind('@');
    if (at == std::string::npos) return;
    text = spec.substr(0, at);
    stall_rank = std::atoi(spec.c_str() + at + 1);
  });
  if (fired || rank != stall_rank || phase.find(text) == std::string::npos) return;
  fired = true;
  std::fprintf(stderr, "gpt-train: [rank %d] GPT_TRAIN_FAULT_STALL: stalling in %s\n", rank, phase.c_str());
  std::fflush(stderr);
  if (!spin) std::raise(SIGSTOP);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

WatchdogScope::WatchdogScope(const std::string& what, Watchdog::Kind kind) : dog_(process_watchdog()) {
  if (!dog_) return;
  previous_ = dog_->arm(what, kind);
  maybe_stall(what, dog_->rank());
}

WatchdogScope::~WatchdogScope() {
  if (dog_) dog_->restore(previous_);
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
