// The lock a training run holds on its checkpoint directory, so that two runs never write one directory
// (they would both write iter_N and prune each other's checkpoints). The lock is the file
// `checkpoint.dir/gpt-train.lock`, created exclusively, naming the host, process and start time of its
// holder; a heartbeat refreshes its modification time while the run lives. A lock is stale, and is taken
// over with a warning, when its holder ran on this host and that process is gone, or when it has not
// been refreshed for `stale_s` seconds (a holder on another host, whose process cannot be checked), or when
// it belongs to the same Slurm job (SLURM_JOB_ID), restarted on any node. A take-over first moves the
// stale file to a name of its own, so two starting runs cannot both take it. The heartbeat notices when
// the lock stopped being this run's (taken over while this process was stopped), and every save checks.
// Taking the lock is also the start-up check that the directory is writable.
#pragma once
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace gpt {

constexpr const char* kLockFile = "gpt-train.lock";

class CheckpointDirLock {
 public:
  // Creates `dir` if needed and takes its lock; throws CheckpointError naming the directory and, when it
  // is held, the holder. `warning` receives the take-over message when a stale lock was replaced.
  CheckpointDirLock(const std::string& dir, double stale_s, std::string* warning = nullptr);
  // Stops the heartbeat and deletes the lock file if it is still this run's.
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  const std::string& path() const { return path_; }
  // Throws CheckpointError when the lock is no longer this run's.
  void require_held() const;
  // The lock's text for this process: host, pid, start time and a token unique to this holder.
  static std::string describe_holder(const std::string& token);

 private:
  void heartbeat(double interval_s);
  bool still_ours() const;

  std::string path_, token_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// Throws CheckpointError when this process locked `dir` and has lost that lock; nothing when it holds no
// lock on `dir` (tests and tools that write checkpoints without one).
void require_lock_held_if_locked(const std::string& dir);

}  // namespace gpt
