// Unit tests for the stop-signal handlers (app/signals.*) and the watchdog (app/watchdog.*): a first
// SIGTERM/SIGUSR1 only sets the flag, a different second signal or a late repeat exits at once with
// 128 + signal and a message naming the rank, a quick repeat of the same signal is ignored; the watchdog
// fires once per armed phase that outlives the timeout (naming the rank and the phase), never while
// disarmed or re-armed in time, and notices when its parent process goes away; the MPI error handler
// names the rank.
#include <gtest/gtest.h>
#include <mpi.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "app/signals.h"
#include "app/watchdog.h"
#include "model/communicator.h"

namespace gpt {
namespace {

using namespace std::chrono_literals;

// Death tests re-execute the binary rather than fork this one: the process has MPI and, in some tests,
// a watchdog thread running.
class ThreadsafeDeathTests : public testing::Environment {
 public:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};
const auto* const kDeathTestStyle = testing::AddGlobalTestEnvironment(new ThreadsafeDeathTests);

TEST(StopSignals, FirstSignalOnlySetsTheFlag) {
  install_stop_signal_handlers(4);
  EXPECT_EQ(stop_signal_received(), 0);
  testing::internal::CaptureStderr();
  std::raise(SIGUSR1);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(stop_signal_received(), SIGUSR1);
  EXPECT_NE(err.find("[rank 4] received SIGUSR1: finishing the current step"), std::string::npos) << err;
  // A repeat of the same signal right away is the launcher's echo: still running, flag unchanged.
  std::raise(SIGUSR1);
  EXPECT_EQ(stop_signal_received(), SIGUSR1);
  // Installing again clears the request.
  install_stop_signal_handlers(4);
  EXPECT_EQ(stop_signal_received(), 0);
  restore_default_signal_handlers();
}

TEST(StopSignals, DifferentSecondSignalExitsAtOnce) {
  EXPECT_EXIT(
      {
        install_stop_signal_handlers(7);
        std::raise(SIGTERM);
        std::raise(SIGUSR1);
        std::this_thread::sleep_for(5s);  // not reached
        std::exit(0);
      },
      testing::ExitedWithCode(128 + SIGUSR1),
      "\\[rank 7\\] received SIGUSR1 while already stopping \\(first signal: SIGTERM\\): exiting at once");
}

TEST(StopSignals, LateRepeatOfTheSameSignalExitsAtOnce) {
  EXPECT_EXIT(
      {
        install_stop_signal_handlers(2);
        std::raise(SIGTERM);
        std::this_thread::sleep_for(1200ms);  // past the echo window
        std::raise(SIGTERM);
        std::this_thread::sleep_for(5s);
        std::exit(0);
      },
      testing::ExitedWithCode(128 + SIGTERM), "\\[rank 2\\] received SIGTERM while already stopping");
}

TEST(StopSignals, AgreementOverAGroupOfOne) {
  SelfCommunicator self("world");
  clear_stop_request();
  EXPECT_EQ(agree_on_stop(self, false).signal, 0);
  EXPECT_TRUE(agree_on_stop(self, true).time_up);
  EXPECT_FALSE(agree_on_stop(self, false).time_up);
  request_stop(SIGTERM);
  request_stop(SIGUSR1);  // the first request stays
  EXPECT_EQ(stop_signal_received(), SIGTERM);
  EXPECT_EQ(agree_on_stop(self, false).signal, SIGTERM);
  clear_stop_request();
  EXPECT_EQ(signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(signal_name(99), "signal 99");
}

// Collects watchdog expiries instead of aborting.
struct Expiries {
  std::mutex mu;
  std::vector<std::string> messages;
  std::vector<std::chrono::steady_clock::time_point> times;
  Watchdog::Action action() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(m);
      times.push_back(std::chrono::steady_clock::now());
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return messages.size();
  }
};

TEST(Watchdog, FiresOncePerStalledPhaseNamingRankAndPhase) {
  Expiries seen;
  Watchdog dog({/*rank=*/5, /*step_timeout_s=*/0.3, /*watch_parent=*/false, /*poll_s=*/0.05}, seen.action());
  auto armed = std::chrono::steady_clock::now();
  dog.arm("iteration 12");
  for (int i = 0; i < 300 && seen.count() == 0; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(500ms);
  ASSERT_EQ(seen.count(), 1u);  // once, not every poll
  const std::string& m = seen.messages[0];
  EXPECT_NE(m.find("[rank 5] watchdog: iteration 12 has made no progress for"), std::string::npos) << m;
  EXPECT_NE(m.find("training.step_timeout_s = 0.3"), std::string::npos) << m;
  double after = std::chrono::duration<double>(seen.times[0] - armed).count();
  EXPECT_GE(after, 0.3);
  EXPECT_LT(after, 2.0);  // the deadline, not the next poll or later (with room for a loaded machine)
}

TEST(Watchdog, QuietWhileDisarmedOrReArmedInTime) {
  Expiries seen;
  Watchdog dog({1, 1.0, false, 0.05}, seen.action());
  for (int i = 0; i < 20; ++i) {  // 20 steps of 0.1 s each: 2 s in all, never 1 s in one phase
    dog.arm("iteration " + std::to_string(i + 1));
    std::this_thread::sleep_for(100ms);
  }
  dog.disarm();
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(seen.count(), 0u);
  dog.arm("iteration 21");  // and it still works afterwards
  for (int i = 0; i < 300 && seen.count() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(seen.count(), 1u);
}

TEST(Watchdog, LongPhasesHaveTheStartupTimeout) {
  Expiries seen;
  Watchdog dog({4, /*step_timeout_s=*/0.2, false, 0.05, /*startup_timeout_s=*/1.0}, seen.action());
  auto armed = std::chrono::steady_clock::now();
  dog.arm("saving the checkpoint of iteration 8", Watchdog::Kind::Long);
  for (int i = 0; i < 300 && seen.count() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(seen.count(), 1u);
  EXPECT_GE(std::chrono::duration<double>(seen.times[0] - armed).count(), 1.0);  // not the step timeout
  const std::string& m = seen.messages[0];
  EXPECT_NE(m.find("[rank 4] watchdog: saving the checkpoint of iteration 8 has made no progress"), std::string::npos) << m;
  EXPECT_NE(m.find("training.startup_timeout_s = 1"), std::string::npos) << m;
  // Not in a communication call: this rank says that it is the stalled one.
  EXPECT_NE(m.find("this rank is computing, in no communication call: it is the stalled rank"), std::string::npos) << m;
}

TEST(Watchdog, ANestedPhaseHandsTheWatchBack) {
  Expiries seen;
  Watchdog dog({2, 0.4, false, 0.05, 5.0}, seen.action());
  dog.arm("iteration 3");
  const Watchdog::Phase outer = dog.arm("evaluation batch 1 of 2 at iteration 3");
  EXPECT_TRUE(outer.armed);
  EXPECT_EQ(outer.what, "iteration 3");
  std::this_thread::sleep_for(200ms);
  dog.restore(outer);  // the clock of "iteration 3" restarts: the nested phase was progress
  std::this_thread::sleep_for(250ms);
  EXPECT_EQ(seen.count(), 0u);
  for (int i = 0; i < 300 && seen.count() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(seen.count(), 1u);
  EXPECT_NE(seen.messages[0].find("watchdog: iteration 3 has made no progress"), std::string::npos) << seen.messages[0];
  {
    CommunicationMarker waiting("tp");  // a rank waiting for its peers says so
    dog.arm("iteration 4");
    for (int i = 0; i < 300 && seen.count() == 1; ++i) std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(seen.count(), 2u);
  EXPECT_NE(seen.messages[1].find("this rank is waiting in communication (tp group) for a rank that is dead or stuck"),
            std::string::npos)
      << seen.messages[1];
}

TEST(Watchdog, ZeroTimeoutNeverFires) {
  Expiries seen;
  Watchdog dog({0, 0.0, false, 0.05}, seen.action());
  dog.arm("iteration 1");
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(seen.count(), 0u);
}

TEST(Watchdog, ScopeArmsOnlyTheProcessWatchdog) {
  { WatchdogScope idle("iteration 1"); }  // no process watchdog: nothing to arm, no crash
  EXPECT_EQ(process_watchdog(), nullptr);
  start_process_watchdog({0, 0.0, false, 0.05});
  EXPECT_NE(process_watchdog(), nullptr);
  { WatchdogScope step("iteration 1"); }
  stop_process_watchdog();
  EXPECT_EQ(process_watchdog(), nullptr);
}

// A grandchild whose parent exits: its watchdog reports the launcher gone through a pipe.
TEST(Watchdog, NoticesWhenTheParentProcessIsGone) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pid_t grandchild = fork();
    if (grandchild == 0) {
      close(fds[0]);
      const int out = fds[1];
      Watchdog dog({9, 0.0, /*watch_parent=*/true, 0.05}, [out](const std::string& m) {
        (void)!write(out, m.data(), m.size());
        _exit(0);
      });
      std::this_thread::sleep_for(10s);  // killed by the test or exits from the action
      _exit(1);
    }
    // The "launcher" goes away once its child has started its watchdog.
    std::this_thread::sleep_for(300ms);
    _exit(0);
  }
  close(fds[1]);
  int status = 0;
  waitpid(child, &status, 0);
  pollfd p{fds[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "no report within 5 s of the parent's exit";
  char buf[512] = {0};
  ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  ASSERT_GT(n, 0);
  std::string m(buf, static_cast<size_t>(n));
  EXPECT_NE(m.find("[rank 9] watchdog: the launcher process that started this rank"), std::string::npos) << m;
  EXPECT_NE(m.find("is gone"), std::string::npos) << m;
}

TEST(MpiErrorHandler, NamesTheRankAndAborts) {
  EXPECT_EXIT(
      {
        install_mpi_error_handler(6);
        int value = 0;
        // A send to a rank that does not exist is an MPI error on MPI_COMM_WORLD.
        MPI_Send(&value, 1, MPI_INT, 1 << 20, 0, MPI_COMM_WORLD);
        std::exit(0);
      },
      [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); },
      "\\[rank 6\\] MPI error on MPI_COMM_WORLD: .*aborting the job");
}

}  // namespace
}  // namespace gpt
