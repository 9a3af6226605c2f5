// One rank's checkpoint file (see checkpoint_writer.h): the snapshot pool and copy, the writer shared by
// synchronous and background saves, and the background thread.
#include "parallel/checkpoint/checkpoint_writer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

#include "parallel/checkpoint/checkpoint_lock.h"

namespace gpt {

namespace {

// Training first: a background thread of a save takes the cycles training leaves (on Linux each thread
// has a nice value of its own). A hint: where it cannot be set, nothing changes.
void yield_to_training() { setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19); }

}  // namespace

int64_t layout_snapshot(std::vector<RankPiece>& pieces) {
  int64_t floats = 0;
  for (RankPiece& p : pieces) {
    p.offset = floats;
    floats += (p.numel() + 15) / 16 * 16;  // 64-byte aligned pieces
  }
  return floats;
}

HostBufferPool::~HostBufferPool() {
  if (preparing_.joinable()) preparing_.join();
  if (data_) backend_.free_host(data_);
}

void HostBufferPool::prepare(int64_t floats) {
  if (preparing_.joinable() || floats <= planned_) return;
  planned_ = floats;
  // At the normal priority: it runs once, during the first steps, and must be done by the first save.
  preparing_ = std::thread([this, floats] {
    try {
      volatile char* bytes = reinterpret_cast<volatile char*>(grow(floats));
      for (int64_t i = 0; i < floats * static_cast<int64_t>(sizeof(float)); i += 4096) bytes[i] = 0;
    } catch (const std::exception& e) {
      prepare_error_ = e.what();
    }
  });
}

float* HostBufferPool::reserve(int64_t floats) {
  if (preparing_.joinable()) preparing_.join();
  if (!prepare_error_.empty()) {
    const std::string error = std::move(prepare_error_);
    prepare_error_.clear();
    planned_ = capacity_;
    throw std::runtime_error(error);
  }
  float* data = grow(floats);
  planned_ = capacity_;
  return data;
}

float* HostBufferPool::grow(int64_t floats) {
  if (floats <= capacity_) return data_;
  if (data_) backend_.free_host(data_);
  data_ = nullptr;
  capacity_ = 0;
  data_ = static_cast<float*>(backend_.alloc_host(static_cast<size_t>(floats) * sizeof(float)));
  capacity_ = floats;
  return data_;
}

void copy_to_snapshot(Backend& backend, const std::vector<RankPiece>& pieces, float* snapshot) {
  for (const RankPiece& p : pieces) backend.download(*p.source, snapshot + p.offset);
}

void checkpoint_fault_pause(const char* point, int rank, int64_t iteration) {
  const char* env = std::getenv("GPT_TRAIN_FAULT_CHECKPOINT_PAUSE");  // read at each point: tests set it late
  if (!env) return;
  const std::string spec = env;
  const size_t at = spec.find('@'), colon = spec.find(':', at == std::string::npos ? 0 : at);
  if (at == std::string::npos || colon == std::string::npos || spec.compare(0, at, point) != 0 ||
      std::strlen(point) != at)
    return;
  const std::string r = spec.substr(at + 1, colon - at - 1);
  const double seconds = std::atof(spec.c_str() + colon + 1);
  const size_t slash = spec.find('/', colon);
  if ((r != "*" && std::atoi(r.c_str()) != rank) ||
      (slash != std::string::npos && std::atoll(spec.c_str() + slash + 1) != iteration))
    return;
  std::fprintf(stderr,
               "gpt-train: [rank %d] GPT_TRAIN_FAULT_CHECKPOINT_PAUSE: checkpoint write of iteration %lld paused at %s "
               "for %g s\n",
               rank, static_cast<long long>(iteration), point, seconds);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

StoredFile write_rank_file(const std::string& path, int rank, int64_t iteration, const std::vector<RankPiece>& pieces,
                           const PieceValues& values, bool& wrote, const std::atomic<bool>* cancel) {
  wrote = !pieces.empty();
  if (!wrote) return {};
  checkpoint_fault_pause("before_file", rank, iteration);
  ShardFileWriter writer(path, rank, iteration);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (cancel && cancel->load(std::memory_order_relaxed))
      throw CheckpointError("the write of " + path + " was cancelled (the run is stopping)");
    const RankPiece& p = pieces[i];
    const float* v = values(i);
    // Diverged weights are never saved: the checkpoint they would replace or prune is the good one.
    if (p.kind == "model" || p.kind == "master")
      for (int64_t k = 0; k < p.numel(); ++k)
        if (!std::isfinite(v[k]))
          throw CheckpointError(fmt::format("tensor {} ({}) holds a non-finite value ({}) at local element {}: the "
                                            "weights diverged, and a checkpoint of them is refused",
                                            p.name, p.kind, v[k], p.begin + k));
    writer.write(p.kind, p.name, p.global, p.shard, p.begin, p.end, v, p.dtype, cancel);
    if (i == 0) checkpoint_fault_pause("mid_file", rank, iteration);
  }
  StoredFile file = writer.finish();
  checkpoint_fault_pause("after_fsync", rank, iteration);
  return file;
}

BackgroundRankWriter::~BackgroundRankWriter() { cancel(); }

void BackgroundRankWriter::cancel() {
  cancel_ = true;
  if (thread_.joinable()) thread_.join();
}

void BackgroundRankWriter::start(std::string path, std::string dir, int rank, int64_t iteration,
                                 std::vector<RankPiece> pieces, const float* snapshot) {
  if (thread_.joinable()) throw std::logic_error("BackgroundRankWriter::start: a write is still in flight");
  finished_ = false;
  cancel_ = false;
  result_ = RankWriteResult();
  thread_ = std::thread([this, path = std::move(path), dir = std::move(dir), rank, iteration,
                         pieces = std::move(pieces), snapshot] {
    const auto t0 = std::chrono::steady_clock::now();
    yield_to_training();
    try {
      result_.file = write_rank_file(
          path, rank, iteration, pieces, [&](size_t i) { return snapshot + pieces[i].offset; }, result_.wrote,
          &cancel_);
      // The lock may have been taken over while the file was written (this process stopped, say).
      require_lock_held_if_locked(dir);
    } catch (const std::exception& e) {
      result_.error = e.what();
    }
    result_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    finished_.store(true, std::memory_order_release);
  });
}

RankWriteResult BackgroundRankWriter::join() {
  if (thread_.joinable()) thread_.join();
  return std::move(result_);
}

}  // namespace gpt
