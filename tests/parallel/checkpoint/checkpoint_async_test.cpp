// Asynchronous checkpoint saves in one process (checkpoint.async_save, parallel/checkpoint/checkpoint_save.h): a run
// saving in the background trains exactly like one saving synchronously and writes the same files (every
// piece's CRC equal), its checkpoints resume bit for bit, saves at every step never overlap (a watcher
// sees at most one staging directory, and each appears only once the previous save is committed and
// `latest` names it), and nothing is pruned before the new checkpoint commits. The process-level cases (SIGKILL and SIGTERM during a background write, a
// full disk) are in tests/async_checkpoint_test.py and tests/disk_full_test.sh.
#include <atomic>
#include <cstdlib>
#include <regex>
#include <set>
#include <thread>

#include "app/config_model.h"
#include "tests/parallel/checkpoint/checkpoint_test_util.h"
#include "parallel/checkpoint/checkpoint_save.h"
#include "parallel/plan/memory_model.h"

using namespace gpt;
using namespace gpt::ckpt_test;

namespace {

// Sets GPT_TRAIN_FAULT_CHECKPOINT_PAUSE for a scope.
struct PauseWrites {
  explicit PauseWrites(const char* spec) { setenv("GPT_TRAIN_FAULT_CHECKPOINT_PAUSE", spec, 1); }
  ~PauseWrites() { unsetenv("GPT_TRAIN_FAULT_CHECKPOINT_PAUSE"); }
};

std::string trimmed_latest(const std::string& dir) {
  std::string text = read_text_file(dir + "/" + kLatestFile);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

CheckpointMeta index_of(const std::string& checkpoint) {
  const std::string path = checkpoint + "/" + kMetadataFile;
  return checkpoint_meta_from_yaml(read_text_file(path), path);
}

// (kind/name, shard range) -> CRC of every stored piece of a checkpoint.
std::map<std::string, uint32_t> piece_crcs(const std::string& checkpoint) {
  std::map<std::string, uint32_t> crcs;
  for (const StoredFile& f : index_of(checkpoint).files)
    for (const StoredPiece& p : f.pieces)
      crcs[fmt::format("{} {}/{} [{}, {})", f.file, p.kind, p.name, p.begin, p.end)] = p.crc32;
  return crcs;
}

void expect_async_equals_sync(Config cfg) {
  cfg.training.train_iters = cfg.optimizer.decay_iters = 12;
  cfg.checkpoint.save_interval = 3;
  cfg.checkpoint.keep_last = 0;
  ParallelState ps = single_process_state();
  const TempDir sync_dir("sync"), async_dir("async");
  Config sync_cfg = cfg, async_cfg = cfg;
  sync_cfg.checkpoint.dir = sync_dir.path;
  sync_cfg.checkpoint.async_save = false;
  async_cfg.checkpoint.dir = async_dir.path;
  async_cfg.checkpoint.async_save = true;
  const RunRecord sync_run = train_run(sync_cfg, ps);
  RunRecord async_run;
  {
    // Each background write starts only after the next steps changed the weights: a writer reading the
    // live tensors instead of the snapshot would store other bytes.
    PauseWrites pause("before_file@*:0.3");
    auto be = make_backend("cpu");
    Trainer t(async_cfg, ps, *be);
    for (const StepStats& st : t.train()) async_run.losses.push_back(st.loss);
    EXPECT_GT(t.checkpoint_host_buffer_bytes(), 0) << "the saves were not asynchronous";
  }
  ASSERT_EQ(async_run.losses, sync_run.losses) << "saving in the background changed the training";
  for (int it : {3, 6, 9, 12}) {
    const std::string name = iteration_dir_name(it);
    const auto a = piece_crcs(async_dir.path + "/" + name), s = piece_crcs(sync_dir.path + "/" + name);
    EXPECT_FALSE(a.empty()) << name;
    EXPECT_EQ(a, s) << name << ": the background write stored other bytes";
    EXPECT_EQ(index_of(async_dir.path + "/" + name).parent, it == 3 ? "" : iteration_dir_name(it - 3));
  }
  EXPECT_EQ(trimmed_latest(async_dir.path), iteration_dir_name(12));

  // Resume the asynchronous run's iteration 6 and run to 12: the same losses as straight through.
  const TempDir resume("async_resume");
  copy_tree(async_dir.path + "/" + iteration_dir_name(6), resume.path + "/" + iteration_dir_name(6));
  std::ofstream(resume.path + "/latest") << iteration_dir_name(6) << "\n";
  Config again = async_cfg;
  again.checkpoint.dir = resume.path;
  const RunRecord rest = train_run(again, ps);
  ASSERT_EQ(rest.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(rest.losses[i], sync_run.losses[6 + i]) << "step " << 7 + i;
}

TEST(CheckpointAsync, Fp32RunWritesTheSameFilesAsSyncSavesAndResumesBitForBit) {
  expect_async_equals_sync(small_config());
}

TEST(CheckpointAsync, Bf16WithMasterWeightsWritesTheSameFilesAndResumesBitForBit) {
  Config cfg = small_config();
  cfg.precision.dtype = "bf16";
  expect_async_equals_sync(cfg);
}

// Watches a checkpoint directory from another thread while a run saves at every step with slow writes.
struct DirWatcher {
  explicit DirWatcher(std::string dir) : dir(std::move(dir)), thread([this] { watch(); }) {}
  ~DirWatcher() { finish(); }
  void finish() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  void watch() {
    static const std::regex staging("iter_([0-9]+)\\.tmp");
    while (!stop) {
      std::error_code ec;
      std::vector<int64_t> tmp;
      std::set<std::string> complete;
      try {
        for (const auto& e : fs::directory_iterator(dir, ec)) {
          const std::string name = e.path().filename().string();
          std::smatch m;
          if (std::regex_match(name, m, staging)) tmp.push_back(std::stoll(m[1].str()));
          else if (fs::exists(e.path() / kMetadataFile, ec)) complete.insert(name);
        }
      } catch (const fs::filesystem_error&) {
        continue;  // the directory changed under the listing: look again
      }
      most_staging = std::max<int64_t>(most_staging, static_cast<int64_t>(tmp.size()));
      for (int64_t it : tmp) {
        if (it <= 1) continue;
        // While iteration `it` is being written, the save before it is committed, still there, and the one
        // `latest` names. (A listing that raced the commit of `it` itself is no evidence: it is skipped.)
        const std::string previous = iteration_dir_name(it - 1), name = iteration_dir_name(it) + ".tmp";
        std::string latest;
        try {
          latest = trimmed_latest(dir);
        } catch (const std::exception&) {
        }
        std::string problem;
        if (!complete.count(previous)) problem = name + " beside no complete " + previous;
        else if (latest != previous) problem = name + " while latest names '" + latest + "'";
        if (!fs::exists(fs::path(dir) / name, ec)) continue;
        if (!problem.empty()) problems.push_back(problem);
        saw_staging_of.insert(it);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  std::string dir;
  std::atomic<bool> stop{false};
  int64_t most_staging = 0;
  std::set<int64_t> saw_staging_of;
  std::vector<std::string> problems;
  std::thread thread;
};

TEST(CheckpointAsync, SavesAtEveryStepNeverOverlapAndPruneOnlyAfterTheCommit) {
  // Every rank file write sleeps 0.3 s once complete, longer than a step of this model.
  PauseWrites pause("after_fsync@*:0.3");
  Config cfg = small_config();
  cfg.training.train_iters = cfg.optimizer.decay_iters = 6;
  cfg.checkpoint.save_interval = 1;
  cfg.checkpoint.keep_last = 1;
  ParallelState ps = single_process_state();
  const TempDir tmp("overlap");
  cfg.checkpoint.dir = tmp.path;
  fs::create_directories(tmp.path);
  DirWatcher watcher(tmp.path);
  train_run(cfg, ps);
  watcher.finish();
  EXPECT_TRUE(watcher.problems.empty()) << watcher.problems.front();
  EXPECT_EQ(watcher.most_staging, 1) << "two saves were in flight at once";
  EXPECT_GE(watcher.saw_staging_of.size(), 3u) << "the watcher saw too few saves in flight to mean anything";
  // keep_last 1: only the last checkpoint is left, and `latest` names it.
  EXPECT_EQ(trimmed_latest(tmp.path), iteration_dir_name(6));
  EXPECT_TRUE(fs::exists(tmp.path + "/" + iteration_dir_name(6) + "/metadata.yaml"));
  EXPECT_FALSE(fs::exists(tmp.path + "/" + iteration_dir_name(5)));
}

// The memory model's host snapshot (MemoryEstimate::checkpoint_host) against the buffer a run holds:
// equal up to the 64-byte alignment of each piece, for fp32 (values and moments) and bf16 (plus masters).
TEST(CheckpointAsync, MemoryModelCountsTheSnapshotBuffer) {
  for (const char* dtype : {"fp32", "bf16"}) {
    Config cfg = small_config();
    cfg.precision.dtype = dtype;
    cfg.training.train_iters = 2;
    cfg.checkpoint.save_interval = 1;
    ParallelState ps = single_process_state();
    const TempDir tmp("model");
    cfg.checkpoint.dir = tmp.path;
    auto be = make_backend("cpu");
    Trainer t(cfg, ps, *be);
    t.train();
    const MemoryEstimate e =
        estimate_memory(model_description_from_config(cfg), layout_spec_from_config(cfg, ps.layout), 0);
    const int64_t pieces = static_cast<int64_t>(index_of(tmp.path + "/" + iteration_dir_name(2)).files.at(0).pieces.size());
    EXPECT_GT(e.checkpoint_host, 0) << dtype;
    EXPECT_GE(t.checkpoint_host_buffer_bytes(), e.checkpoint_host) << dtype;
    EXPECT_LE(t.checkpoint_host_buffer_bytes(), e.checkpoint_host + 64 * pieces) << dtype;
    cfg.checkpoint.async_save = false;  // synchronous saves hold no snapshot
    EXPECT_EQ(estimate_memory(model_description_from_config(cfg), layout_spec_from_config(cfg, ps.layout), 0)
                  .checkpoint_host,
              0);
  }
}

}  // namespace
