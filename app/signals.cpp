// The stop-signal handlers (SIGTERM, SIGUSR1) and the world-wide agreement on a stop request. The
// handler runs on whichever thread the kernel picks, so it touches only a lock-free atomic, write(2) and
// _exit(2); the message text is composed in a fixed buffer without allocation.
#include "app/signals.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <csignal>
#include <cstring>
#include <string>

#include "model/communicator.h"

namespace gpt {

namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<int> g_rank{0};
std::atomic<int64_t> g_first_signal_ns{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "the signal handler needs lock-free flags");

// A repeat of the first signal within this window counts as the same request.
constexpr int64_t kRepeatWindowNs = 1000000000;

constexpr int kStopSignals[] = {SIGTERM, SIGUSR1};

// Async-signal-safe append of a C string / a non-negative integer to a fixed buffer.
struct SafeBuffer {
  char data[256];
  size_t len = 0;
  void add(const char* s) {
    while (*s && len + 1 < sizeof(data)) data[len++] = *s++;
  }
  void add(int v) {
    char digits[16];
    int n = 0;
    unsigned u = v < 0 ? 0u : static_cast<unsigned>(v);
    do digits[n++] = static_cast<char>('0' + u % 10), u /= 10;
    while (u && n < 16);
    while (n > 0 && len + 1 < sizeof(data)) data[len++] = digits[--n];
  }
  void write_to_stderr() const {
    size_t off = 0;
    while (off < len) {
      ssize_t w = ::write(STDERR_FILENO, data + off, len - off);
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
  }
};

const char* safe_signal_name(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    case SIGUSR2: return "SIGUSR2";
    default: return nullptr;
  }
}

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void stop_handler(int signo) {
  const int saved_errno = errno;
  const int64_t now = monotonic_ns();
  int first_signal = 0;
  const bool first = g_stop_signal.compare_exchange_strong(first_signal, signo);
  if (first) g_first_signal_ns.store(now);
  // srun forwards the SIGTERM that slurmstepd also delivers itself, so one request can arrive twice in
  // quick succession; a repeat of the same signal inside the window is that echo, not a second request.
  if (!first && signo == first_signal && now - g_first_signal_ns.load() < kRepeatWindowNs) {
    errno = saved_errno;
    return;
  }
  SafeBuffer msg;
  msg.add("gpt-train: [rank ");
  msg.add(g_rank.load());
  msg.add("] received ");
  msg.add(safe_signal_name(signo) ? safe_signal_name(signo) : "a stop signal");
  if (first) {
    msg.add(": finishing the current step, then saving a checkpoint and exiting (signal again to exit at once)\n");
    msg.write_to_stderr();
    errno = saved_errno;
    return;
  }
  msg.add(" while already stopping (first signal: ");
  msg.add(safe_signal_name(first_signal) ? safe_signal_name(first_signal) : "?");
  msg.add("): exiting at once without a checkpoint\n");
  msg.write_to_stderr();
  _exit(128 + signo);
}

}  // namespace

void install_stop_signal_handlers(int rank) {
  g_rank.store(rank);
  g_stop_signal.store(0);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = stop_handler;
  sigemptyset(&sa.sa_mask);
  // Block the other stop signals while the handler runs, so two different signals cannot interleave
  // inside it; each still runs the handler once afterwards.
  for (int s : kStopSignals) sigaddset(&sa.sa_mask, s);
  sa.sa_flags = SA_RESTART;  // interrupted blocking calls (file I/O, waits) resume instead of failing
  for (int s : kStopSignals) sigaction(s, &sa, nullptr);
}

void restore_default_signal_handlers() {
  for (int s : kStopSignals) std::signal(s, SIG_DFL);
}

int stop_signal_received() { return g_stop_signal.load(); }

void request_stop(int signo) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, signo);
}

void clear_stop_request() { g_stop_signal.store(0); }

StopAgreement agree_on_stop(Communicator& world, bool time_up) {
  double v[2] = {static_cast<double>(stop_signal_received()), time_up ? 1.0 : 0.0};
  world.all_reduce_host(v, 2, ReduceOp::Max);
  return {static_cast<int>(v[0]), v[1] > 0};
}

std::string signal_name(int signo) {
  if (const char* name = safe_signal_name(signo)) return name;
  return "signal " + std::to_string(signo);
}

}  // namespace gpt
