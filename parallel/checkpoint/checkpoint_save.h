// Saving a distributed checkpoint, synchronously or in the background (checkpoint.async_save; the
// protocol is in docs/checkpoint-format.md). A save has three phases:
//  1. start (collective, blocking): rank 0 makes the staging directory iter_NNNNNNN.tmp and writes the
//     tokenizer's files into it; every rank lists the pieces it owns (parallel/checkpoint/checkpoint_writer.h) and
//     either copies their values into its pooled host snapshot, after which a background thread writes
//     its rank file from the snapshot while training goes on, or (a synchronous save, or a rank whose
//     snapshot would not fit in its share of the host memory available, or could not be allocated)
//     writes the rank file from the live tensors at once;
//  2. each rank's write finishes on its own, with the same file, CRCs and fsync either way;
//  3. commit (collective): once every rank's file is complete and durable, agreed over the world at
//     poll() after a step or at wait(), rank 0 writes metadata.yaml, renames the directory, moves
//     `latest` and only then prunes to keep_last (the pruned directories are renamed out of the complete
//     names at once and deleted on a thread of rank 0's own). A failure on any rank (a full disk, an I/O error, a
//     lost directory lock) is the same CheckpointError on every rank, naming the file, and nothing is
//     renamed, moved or pruned: `latest` keeps naming the last committed checkpoint.
// At most one save is in flight: start() refuses while one is, so callers wait() first.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/checkpoint_writer.h"

namespace gpt {

class CheckpointSaver {
 public:
  // `async` false: every save writes its files inside start() (no snapshot, no host buffer).
  // `ranks_on_host`: the ranks of this process's host, which share its memory for their snapshots.
  CheckpointSaver(Backend& backend, std::string dir, int64_t keep_last, bool async, int ranks_on_host = 1);
  // A write still in flight is cancelled and its staging directory never committed: destruction
  // without wait() is the path of a run that is failing anyway.
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  bool in_flight() const { return pending_ != nullptr; }
  // Not collective: with async saves, sets up this rank's snapshot buffer for `model` in the background
  // (allocated and faulted in while the first steps run), so the first save blocks no longer than the
  // later ones. Optional: start() grows the buffer itself when needed.
  void prepare(const CheckpointModel& model);
  // Collective over model.ps->world. Phase 1 for progress.iteration; throws CheckpointError on every
  // rank when any rank fails it (and std::logic_error while a save is in flight). Returns the seconds
  // this rank was blocked.
  double start(const CheckpointModel& model, const CheckpointProgress& progress);
  // Collective, after every step while a save is in flight (no communication when none is): commits
  // the save once every rank's write is done and returns its report; nullopt while a write still runs.
  // Throws CheckpointError on every rank when any rank's write failed.
  std::optional<CheckpointSaveReport> poll();
  // Collective: waits for the save in flight and commits it (nullopt when none is in flight).
  std::optional<CheckpointSaveReport> wait();
  // Not collective: waits until the directories the last commit pruned are deleted (rank 0 deletes them
  // on a thread of its own, so a commit never waits for the file system's deletions).
  void settle();
  // Host memory held for snapshots (0 for synchronous saves).
  int64_t host_buffer_bytes() const { return pool_.bytes(); }

 private:
  struct Pending;
  CheckpointSaveReport commit();
  // Whether a snapshot of `floats` floats is taken: the pool has them, or growing it takes at most this
  // rank's share (1 / ranks_on_host) of half the host memory still available.
  bool snapshot_fits(int64_t floats) const;

  Backend& backend_;
  std::string dir_;
  int64_t keep_last_;
  bool async_;
  int ranks_on_host_;
  HostBufferPool pool_;
  BackgroundRankWriter writer_;
  std::thread deleter_;  // rank 0: removes the directories a commit pruned, off the training thread
  std::atomic<int> deletions_running_{0};  // deleter threads not yet done
  std::unique_ptr<Pending> pending_;
};

}  // namespace gpt
