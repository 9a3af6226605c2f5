// Checkpoint directory lock (see checkpoint_lock.h): exclusive create, staleness by process or heartbeat,
// atomic take-over by rename, release only of a lock that is still this process's.
#include "parallel/checkpoint/checkpoint_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <map>
#include <sstream>
#include <vector>

#include "parallel/checkpoint/checkpoint_format.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

std::string host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

std::map<std::string, std::string> parse_lock(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

// Seconds since the file was last modified (refreshed by its holder's heartbeat); -1 when unknown.
double age_s(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return std::difftime(std::time(nullptr), st.st_mtime);
}

// Whether process `pid` of this host still runs: it exists and is not a zombie (killed, not yet reaped).
bool process_alive(long pid) {
  if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) return false;
  std::string stat;
  try {
    stat = read_text_file(fmt::format("/proc/{}/stat", pid));
  } catch (const std::exception&) {
    return true;  // no /proc: trust kill()
  }
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

std::string slurm_job() {
  const char* id = std::getenv("SLURM_JOB_ID");
  return id ? id : "";
}

}  // namespace

std::string CheckpointDirLock::describe_holder(const std::string& token) {
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return fmt::format("host={}\npid={}\nslurm_job={}\nstarted={}\ntoken={}\n", host_name(), static_cast<long>(::getpid()),
                     slurm_job(), when, token);
}

namespace {

// The locks this process holds, so the checkpoint writer can check the one of its directory.
std::mutex g_locks_mu;
std::vector<const CheckpointDirLock*> g_locks;  // guarded by g_locks_mu

void register_lock(const CheckpointDirLock* lock) {
  std::lock_guard<std::mutex> guard(g_locks_mu);
  g_locks.push_back(lock);
}

void unregister_lock(const CheckpointDirLock* lock) {
  std::lock_guard<std::mutex> guard(g_locks_mu);
  g_locks.erase(std::remove(g_locks.begin(), g_locks.end(), lock), g_locks.end());
}

// Creates `path` exclusively with `text`, fsynced. False when it exists already; throws on other errors.
bool create_exclusively(const std::string& path, const std::string& text, const std::string& dir) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return false;
    throw CheckpointError("checkpoint directory " + dir + " is not writable: cannot create " + path + ": " +
                          std::strerror(errno));
  }
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    throw CheckpointError("checkpoint directory " + dir + " is not writable: cannot write " + path + ": " +
                          std::strerror(err));
  }
  fsync_path(dir);
  return true;
}

}  // namespace

CheckpointDirLock::CheckpointDirLock(const std::string& dir, double stale_s, std::string* warning)
    : path_((fs::path(dir) / kLockFile).string()) {
  if (!(stale_s > 0)) throw CheckpointError("checkpoint.lock_stale_s must be positive");
  token_ = random_token();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError("checkpoint directory " + dir + " cannot be created: " + ec.message());
  const std::string text = describe_holder(token_);
  // A few rounds: a stale lock moved away by another starting run makes the next create succeed or see
  // that run's fresh lock.
  for (int round = 0; !create_exclusively(path_, text, dir); ++round) {
    std::string held;
    try {
      held = read_text_file(path_);
    } catch (const std::exception&) {
      if (round < 3) continue;  // moved away between the create and the read
    }
    auto holder = parse_lock(held);
    const double age = age_s(path_);
    const bool same_host = holder["host"] == host_name();
    const long pid = std::atol(holder["pid"].c_str());
    const std::string job = slurm_job();
    const bool same_job = !job.empty() && holder["slurm_job"] == job;  // a requeued job, on any node
    const bool stale = same_job || (same_host ? !process_alive(pid) : (age < 0 || age >= stale_s));
    const std::string who = fmt::format("host {} pid {} (started {}, refreshed {:.0f} s ago)",
                                        printable(holder["host"], 64), printable(holder["pid"], 20),
                                        printable(holder["started"], 32), age);
    if (!stale || round >= 3)
      throw CheckpointError(fmt::format(
          "checkpoint directory {} is locked by another run: {} holds {}. Two runs must not write one directory. "
          "If that run is gone, delete the lock file; a lock {} is taken over automatically",
          dir, who, path_,
          same_host ? "whose process is gone" : fmt::format("not refreshed for checkpoint.lock_stale_s = {:g} s", stale_s)));
    // Take over: move the stale lock to a name of our own (only one contender's rename can succeed), check
    // that it is the one judged stale, then create ours exclusively.
    const std::string moved = path_ + ".stale." + token_;
    if (::rename(path_.c_str(), moved.c_str()) != 0) continue;  // another run moved it first
    std::string moved_text;
    try {
      moved_text = read_text_file(moved);
    } catch (const std::exception&) {
    }
    ::unlink(moved.c_str());
    if (parse_lock(moved_text)["token"] != holder["token"]) continue;  // a fresh lock replaced it meanwhile
    if (warning)
      *warning = fmt::format("took over the stale lock {} of {}: {}", path_, who,
                             same_job ? "the same Slurm job, restarted"
                                      : same_host ? "that process is gone" : "its heartbeat stopped");
  }
  register_lock(this);
  const double interval = std::max(0.5, std::min(30.0, stale_s / 4));
  thread_ = std::thread([this, interval] { heartbeat(interval); });
}

CheckpointDirLock::~CheckpointDirLock() {
  unregister_lock(this);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (still_ours()) ::unlink(path_.c_str());
}

bool CheckpointDirLock::still_ours() const {
  try {
    return parse_lock(read_text_file(path_))["token"] == token_;
  } catch (const std::exception&) {
    return false;
  }
}

void CheckpointDirLock::heartbeat(double interval_s) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::duration<double>(interval_s), [this] { return stopping_; })) {
    // Never refresh another run's lock (taken over while this process was stopped or cut off).
    if (still_ours()) ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);  // now
  }
}

void CheckpointDirLock::require_held() const {
  if (!still_ours())
    throw CheckpointError("the lock " + path_ + " is no longer this run's (another run took it over while this one "
                          "was stopped or cut off): refusing to write the checkpoint directory");
}

void require_lock_held_if_locked(const std::string& dir) {
  const std::string path = (fs::path(dir) / kLockFile).string();
  std::lock_guard<std::mutex> guard(g_locks_mu);
  for (const CheckpointDirLock* lock : g_locks)
    if (lock->path() == path) lock->require_held();
}

}  // namespace gpt
