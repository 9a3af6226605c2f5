// Which checkpoint a run continues from and which ones it may delete: resuming the newest complete
// checkpoint that verifies when `latest` is missing, pruning only the run's own lineage (parent links),
// keeping an abandoned branch after a rollback instead of overwriting it, refusing a `latest` that names a
// staging directory or holds binary text, never saving non-finite weights, and the directory lock.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/parallel/checkpoint/checkpoint_test_util.h"
#include "parallel/checkpoint/checkpoint_lock.h"

namespace gpt::ckpt_test {
namespace {

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

Config saving_config(const std::string& dir, int64_t iters, int64_t every, int64_t keep_last) {
  Config cfg = small_config();
  cfg.training.train_iters = iters;
  cfg.checkpoint.dir = dir;
  cfg.checkpoint.save_interval = every;
  cfg.checkpoint.keep_last = keep_last;
  return cfg;
}

// Another lineage's checkpoint at iteration 7 in the same directory: a copy of iteration 5's, whose
// parent is none, with its iteration changed.
void add_foreign_checkpoint(const std::string& dir) {
  copy_tree(dir + "/iter_0000005", dir + "/iter_0000007");
  const std::string index = dir + "/iter_0000007/metadata.yaml";
  std::string text = read_text_file(index);
  text.replace(text.find("iteration: 5"), 12, "iteration: 7");
  write_file_durably(index, text);
}

int64_t resumed_iteration(const Config& cfg, ParallelState& ps) {
  auto be = make_backend("cpu");
  Trainer t(cfg, ps, *be);
  EXPECT_TRUE(t.resume());
  return t.iteration();
}

TEST(CheckpointLineage, MissingLatestResumesTheNewestCompleteCheckpointThatVerifies) {
  const TempDir tmp("nolatest");
  ParallelState ps = single_process_state();
  train_run(saving_config(tmp.path, 10, 5, 0), ps);  // iter 5 and 10
  add_foreign_checkpoint(tmp.path);
  fs::remove(tmp.path + "/latest");
  Config cfg = saving_config(tmp.path, 10, 5, 0);
  {
    auto be = make_backend("cpu");
    Trainer t(cfg, ps, *be);
    ASSERT_TRUE(t.resume());
    EXPECT_EQ(t.iteration(), 10);
  }
  // A damaged newest one is skipped, with the reason; the next verifies. No byte of the damaged one is
  // changed or deleted.
  flip_byte(tmp.path + "/iter_0000010/rank_00000.h5",
            dataset_offset(tmp.path + "/iter_0000010/rank_00000.h5", "/adam_v/layers.1.mlp.fc1.weight") + 100);
  EXPECT_EQ(resumed_iteration(cfg, ps), 7);
  // None verifies: an error that lists each, never a silent start from iteration 0.
  for (const char* d : {"iter_0000005", "iter_0000007"})
    fs::remove(tmp.path + "/" + d + "/rank_00000.h5");
  const std::string e = resume_error(cfg, ps);
  EXPECT_TRUE(contains(e, "latest is missing and no complete checkpoint")) << e;
  EXPECT_TRUE(contains(e, "iter_0000010")) << e;
  EXPECT_TRUE(contains(e, "checksum")) << e;
  EXPECT_TRUE(contains(e, "iter_0000005 (")) << e;
  // A directory whose index names another iteration is not a candidate either.
  fs::remove_all(tmp.path + "/iter_0000010");
  copy_tree(tmp.path + "/iter_0000007", tmp.path + "/iter_0000009");
  EXPECT_TRUE(contains(resume_error(cfg, ps), "iter_0000009 (its index says iteration 7)")) << resume_error(cfg, ps);
}

TEST(CheckpointLineage, PruningDeletesOnlyThisLineagesOlderCheckpoints) {
  const TempDir tmp("lineage");
  ParallelState ps = single_process_state();
  train_run(saving_config(tmp.path, 10, 5, 0), ps);  // iter 5 -> iter 10
  add_foreign_checkpoint(tmp.path);
  fs::remove(tmp.path + "/latest");
  // Continue from iter 10 (latest missing) with keep_last 1: 10 and 5 are this lineage's, 7 is not.
  train_run(saving_config(tmp.path, 12, 0, 1), ps);
  EXPECT_EQ(entries(tmp.path), (std::vector<std::string>{"iter_0000007", "iter_0000012", "latest"}));
  const std::string meta = read_text_file(tmp.path + "/iter_0000012/metadata.yaml");
  EXPECT_TRUE(contains(meta, "parent: iter_0000010")) << meta;
}

TEST(CheckpointLineage, RollbackKeepsTheRollbackPointAndTheAbandonedBranch) {
  const TempDir tmp("rollback");
  ParallelState ps = single_process_state();
  train_run(saving_config(tmp.path, 6, 2, 0), ps);  // 2, 4, 6
  const std::string old4 = read_text_file(tmp.path + "/iter_0000004/metadata.yaml");
  write_file_durably(tmp.path + "/latest", "iter_0000002\n");  // roll back
  train_run(saving_config(tmp.path, 4, 2, 2), ps);
  EXPECT_EQ(entries(tmp.path), (std::vector<std::string>{"iter_0000002", "iter_0000004", "iter_0000004.abandoned",
                                                         "iter_0000006", "latest"}));
  EXPECT_EQ(read_text_file(tmp.path + "/iter_0000004.abandoned/metadata.yaml"), old4);  // untouched
  EXPECT_EQ(read_text_file(tmp.path + "/latest"), "iter_0000004\n");
  // On to 8: the new lineage is 8 -> 6 -> 4 -> 2; keep_last 2 keeps 8 and 6. The abandoned ones stay.
  train_run(saving_config(tmp.path, 8, 2, 2), ps);
  EXPECT_EQ(entries(tmp.path), (std::vector<std::string>{"iter_0000004.abandoned", "iter_0000006",
                                                         "iter_0000006.abandoned", "iter_0000008", "latest"}));
  // Abandoned directories are never loaded: with `latest` gone the newest complete one is iter_0000008.
  fs::remove(tmp.path + "/latest");
  EXPECT_EQ(resumed_iteration(saving_config(tmp.path, 8, 2, 2), ps), 8);
}

// A parent name that now belongs to another lineage's directory (a rollback renamed the original) ends the
// pruning walk: its id differs from the one recorded.
TEST(CheckpointLineage, AParentNameTakenByAnotherLineageIsNotPruned) {
  const TempDir tmp("reused");
  ParallelState ps = single_process_state();
  train_run(saving_config(tmp.path, 6, 2, 0), ps);  // lineage A: 2, 4, 6
  write_file_durably(tmp.path + "/latest", "iter_0000002\n");
  train_run(saving_config(tmp.path, 4, 2, 0), ps);  // lineage B from 2: its own 4 (A's is iter_0000004.abandoned)
  const std::string b4 = read_text_file(tmp.path + "/iter_0000004/metadata.yaml");
  write_file_durably(tmp.path + "/latest", "iter_0000006\n");  // back to A's newest
  train_run(saving_config(tmp.path, 8, 2, 1), ps);  // 8 -> 6 -> "iter_0000004" (B's now): the walk stops at 6
  EXPECT_EQ(entries(tmp.path), (std::vector<std::string>{"iter_0000002", "iter_0000004", "iter_0000004.abandoned",
                                                         "iter_0000008", "latest"}));
  EXPECT_EQ(read_text_file(tmp.path + "/iter_0000004/metadata.yaml"), b4);
}

TEST(CheckpointLineage, LatestNamingAStagingDirectoryOrHoldingBinaryIsAnError) {
  const TempDir tmp("badlatest");
  ParallelState ps = single_process_state();
  train_run(saving_config(tmp.path, 2, 0, 0), ps);
  copy_tree(tmp.path + "/iter_0000002", tmp.path + "/iter_0000003.tmp");  // complete-looking, but staging
  write_file_durably(tmp.path + "/latest", "iter_0000003.tmp\n");
  Config cfg = saving_config(tmp.path, 2, 0, 0);
  std::string e = resume_error(cfg, ps);
  EXPECT_TRUE(contains(e, "holds 'iter_0000003.tmp'")) << e;
  EXPECT_TRUE(contains(e, "never loaded")) << e;
  write_file_durably(tmp.path + "/latest", std::string("\x01\xff\x7fiter\0x", 9));
  e = resume_error(cfg, ps);
  EXPECT_TRUE(contains(e, "holds '\\x01\\xff\\x7fiter\\x00x'")) << e;
  EXPECT_EQ(e.find('\x01'), std::string::npos);
  EXPECT_EQ(e.find('\xff'), std::string::npos);
}

TEST(CheckpointLineage, NonFiniteWeightsAreNeverSaved) {
  const TempDir tmp("nonfinite");
  ParallelState ps = single_process_state();
  Config cfg = saving_config(tmp.path, 2, 0, 1);
  auto be = make_backend("cpu");
  Trainer t(cfg, ps, *be);
  t.train();  // saves iter 2
  Parameter& p = *t.chunks().front()->params().params().front();
  p.value.f32()[3] = std::nanf("");
  t.set_progress(3, 48);
  try {
    t.save_checkpoint();
    FAIL() << "a checkpoint of non-finite weights was written";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), p.name)) << e.what();
    EXPECT_TRUE(contains(e.what(), "non-finite")) << e.what();
  }
  EXPECT_EQ(read_text_file(tmp.path + "/latest"), "iter_0000002\n");  // the good one stays, unpruned
  EXPECT_TRUE(fs::exists(tmp.path + "/iter_0000002/metadata.yaml"));
  EXPECT_FALSE(fs::exists(tmp.path + "/iter_0000003"));
}

TEST(CheckpointDirLockTest, HeldLocksAreRefusedStaleOnesTakenOver) {
  const TempDir tmp("lock");
  const std::string lock = tmp.path + "/" + kLockFile;
  {
    CheckpointDirLock held(tmp.path, 300);
    EXPECT_TRUE(fs::exists(lock));
    // The holder is this live process: refused, naming it.
    try {
      CheckpointDirLock second(tmp.path, 300);
      FAIL() << "a held lock was taken";
    } catch (const CheckpointError& e) {
      EXPECT_TRUE(contains(e.what(), "is locked by another run")) << e.what();
      EXPECT_TRUE(contains(e.what(), "pid " + std::to_string(getpid()))) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(lock));  // released on exit
  // Another host's lock: refused while its heartbeat is fresh, taken over once it is older than stale_s.
  write_file_durably(lock, "host=some-other-host\npid=1\nstarted=2026-01-01T00:00:00Z\ntoken=abc\n");
  try {
    CheckpointDirLock second(tmp.path, 300);
    FAIL() << "a fresh lock of another host was taken";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "host some-other-host pid 1")) << e.what();
    EXPECT_TRUE(contains(e.what(), "checkpoint.lock_stale_s = 300")) << e.what();
  }
  fs::last_write_time(lock, fs::file_time_type::clock::now() - std::chrono::seconds(1000));
  std::string warning;
  {
    CheckpointDirLock taken(tmp.path, 300, &warning);
    EXPECT_TRUE(contains(warning, "took over the stale lock")) << warning;
    EXPECT_TRUE(contains(warning, "its heartbeat stopped")) << warning;
    EXPECT_TRUE(contains(read_text_file(lock), "pid=" + std::to_string(getpid())));
  }
  // A lock taken over behind this run's back (while it was stopped) is noticed before any write.
  {
    CheckpointDirLock held(tmp.path, 300);
    write_file_durably(lock, "host=elsewhere\npid=7\nstarted=x\ntoken=not-ours\n");
    EXPECT_THROW(held.require_held(), CheckpointError);
    try {
      begin_checkpoint_dir(tmp.path, 5);
      FAIL() << "a save went ahead without the lock";
    } catch (const CheckpointError& e) {
      EXPECT_TRUE(contains(e.what(), "no longer this run's")) << e.what();
    }
  }
  EXPECT_TRUE(contains(read_text_file(lock), "token=not-ours"));  // another's lock is never deleted
  // The same Slurm job restarted on another node takes its own lock over at once.
  setenv("SLURM_JOB_ID", "4242", 1);
  write_file_durably(lock, "host=other-node\npid=9\nslurm_job=4242\nstarted=x\ntoken=t\n");
  {
    CheckpointDirLock requeued(tmp.path, 300, &warning);
    EXPECT_TRUE(contains(warning, "the same Slurm job, restarted")) << warning;
  }
  unsetenv("SLURM_JOB_ID");
  // A directory that cannot be created is reported as such, at start-up.
  write_file_durably(tmp.path + "/plain-file", "x");
  try {
    CheckpointDirLock bad(tmp.path + "/plain-file/ckpt", 300);
    FAIL() << "no error for a directory under a file";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "plain-file/ckpt cannot be created")) << e.what();
  }
}

}  // namespace
}  // namespace gpt::ckpt_test
