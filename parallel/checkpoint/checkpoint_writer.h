// One rank's part of a checkpoint save, with no MPI in it: the pieces this rank writes, a snapshot of their
// values in host memory (the blocking copy of an asynchronous save, into one pooled buffer reused by
// every save: page-locked on CUDA, so the device-to-host copy runs at full bus speed), and the rank file
// written from the snapshot on a background thread or from the live tensors on the calling thread (a
// synchronous save). Either way the file, its CRCs and its fsync are the same; the commit that makes the
// files a checkpoint is collective and lives in parallel/checkpoint/checkpoint_save.cpp.
// The background thread touches nothing of the model: each piece carries copies of its names, shapes
// and shard, and its values are in the snapshot. It runs at the lowest priority (nice 19), so on a
// machine whose cores all train (the CPU backend) the write takes the cycles training leaves, not the
// steps' own.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "model/ops/backend.h"
#include "parallel/checkpoint/checkpoint_format.h"

namespace gpt {

// One stored piece of this rank's file: local elements [begin, end) of a global tensor's shard.
struct RankPiece {
  std::string kind;  // model | master | adam_m | adam_v
  std::string name;
  Shape global;
  ShardSpec shard;
  int64_t begin = 0, end = 0;
  DType dtype = DType::F32;  // the dtype of the values (exact in fp32: they are stored converted back)
  const Tensor* source = nullptr;  // the live tensor; read on the calling thread only
  int64_t offset = 0;              // floats into the snapshot
  int64_t numel() const { return end - begin; }
};

// Floats a snapshot of `pieces` takes, and assigns each piece its offset in it.
int64_t layout_snapshot(std::vector<RankPiece>& pieces);

// Host memory for snapshots: one buffer, grown when a save needs more and reused by every later save,
// from the backend's host allocator (page-locked on CUDA).
class HostBufferPool {
 public:
  explicit HostBufferPool(Backend& backend) : backend_(backend) {}
  ~HostBufferPool();
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;
  // At least `floats` floats (contents not kept across a growth); waits for a prepare() in progress.
  float* reserve(int64_t floats);
  // Grows the buffer to `floats` and touches every page of it on a thread of its own, so the first
  // save's copy does not pay the page faults (seconds per GB on some machines).
  void prepare(int64_t floats);
  // The size the buffer has, or will have once a prepare() in progress is done (read on the calling
  // thread only: the prepare thread does not touch it).
  int64_t bytes() const { return planned_ * static_cast<int64_t>(sizeof(float)); }

 private:
  float* grow(int64_t floats);

  Backend& backend_;
  float* data_ = nullptr;   // data_ and capacity_: the prepare thread's until it is joined
  int64_t capacity_ = 0;
  int64_t planned_ = 0;
  std::thread preparing_;
  std::string prepare_error_;  // of the thread: reserve() rethrows it
};

// Copies every piece's values into `snapshot` at its offset (through the backend: device memory and
// 16-bit dtypes arrive as exact fp32). The blocking part of an asynchronous save.
void copy_to_snapshot(Backend& backend, const std::vector<RankPiece>& pieces, float* snapshot);

// Writes `pieces` into a fresh rank file `path` and fsyncs it; `values(i)` gives piece i's floats. Refuses
// (CheckpointError) model or master values that are not finite. Stops with CheckpointError when `cancel`
// becomes true. Returns the file's index entry; `wrote` is false when there were no pieces (no file).
using PieceValues = std::function<const float*(size_t piece)>;
StoredFile write_rank_file(const std::string& path, int rank, int64_t iteration, const std::vector<RankPiece>& pieces,
                           const PieceValues& values, bool& wrote, const std::atomic<bool>* cancel = nullptr);

// The outcome of one rank's write.
struct RankWriteResult {
  StoredFile file;
  bool wrote = false;
  std::string error;   // "" when the file is complete and durable
  double seconds = 0;  // the write, from start to fsync
};

// write_rank_file from a snapshot on a thread of its own. One write at a time.
class BackgroundRankWriter {
 public:
  BackgroundRankWriter() = default;
  // Cancels a write still running and waits for its thread (the staging file it leaves is never committed).
  ~BackgroundRankWriter();
  BackgroundRankWriter(const BackgroundRankWriter&) = delete;
  BackgroundRankWriter& operator=(const BackgroundRankWriter&) = delete;

  // `snapshot` must stay valid and unchanged until join() returns. Once the file is durable, the write
  // checks that this process still holds checkpoint directory `dir`'s lock, if it took one.
  void start(std::string path, std::string dir, int rank, int64_t iteration, std::vector<RankPiece> pieces,
             const float* snapshot);
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  // Waits for the write and returns its outcome.
  RankWriteResult join();
  // Stops a write in flight between slabs and waits for its thread; its outcome is dropped.
  void cancel();

 private:
  std::thread thread_;
  std::atomic<bool> finished_{false}, cancel_{false};
  RankWriteResult result_;
};

// Test hook GPT_TRAIN_FAULT_CHECKPOINT_PAUSE="POINT@RANK:SECONDS[/ITERATION]" (RANK may be *): the rank
// file writer of that rank prints a line to stderr and sleeps SECONDS at POINT of every save (or only the
// save of ITERATION), where POINT is
// before_file (the snapshot taken, no file yet), mid_file (after the first piece) or after_fsync (the file
// complete and durable, before the commit). Lets tests kill or signal a process at a known point of a
// background write.
void checkpoint_fault_pause(const char* point, int rank, int64_t iteration);

}  // namespace gpt
