// Distributed checkpoint saves (see checkpoint_save.h): who writes which piece, the snapshot or direct
// write of start(), the world-wide agreement on the writes' outcome, and the commit that makes a save
// the one `latest` names.
#include "parallel/checkpoint/checkpoint_save.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <sstream>

#include "parallel/comm/host_messages.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

// The pieces this rank writes: each optimizer segment (the whole parameter, or with ZeRO-1 this
// data-parallel rank's part) gives its model values, fp32 master weights (when distinct from the values)
// and Adam moments, written by data-parallel rank 0 only when the state is replicated over dp;
// tensor-parallel replicas are written by tp rank 0 only and the tied LM-head copy not at all.
std::vector<RankPiece> rank_pieces(const CheckpointModel& m) {
  const ParallelState& ps = *m.ps;
  std::vector<RankPiece> pieces;
  for (OptimizerSegment& s : m.optimizer->adam().segments()) {
    const Parameter& p = *s.param;
    if (p.tied_copy) continue;                                       // the word embedding is saved by its owner
    if (p.tp_replicated && ps.tp_rank() != 0) continue;              // identical on every tp rank
    if (!m.optimizer->distributed() && ps.dp_rank() != 0) continue;  // replicated over dp
    auto [begin, end] = segment_range(s);
    auto add = [&](const char* kind, const Tensor& t) {
      pieces.push_back({kind, p.name, p.global_shape, p.shard, begin, end, t.dtype(), &t, 0});
    };
    add("model", s.value);
    if (s.master.raw() != s.value.raw()) add("master", s.master);
    if (!m.save_optimizer_state) continue;
    add("adam_m", s.m);
    add("adam_v", s.v);
  }
  if (ps.tp_rank() == 0 && ps.dp_rank() == 0)  // the FP8 scales are the same on all of the stage's tp x dp ranks
    for (const auto& [name, t] : m.fp8_state)
      pieces.push_back({"fp8", name, t.shape(), ShardSpec{}, 0, t.numel(), DType::F32, &t, 0});
  return pieces;
}

// Writes the tokenizer's files into the staging directory's tokenizer/ under fixed names (durably,
// before the commit), and returns the record with their paths relative to the checkpoint directory.
TokenizerRecord store_tokenizer_files(const TokenizerRecord& record, const std::map<std::string, std::string>& files,
                                      const fs::path& staging) {
  static const std::map<std::string, std::string> kNames = {
      {"vocab", "vocab.json"}, {"merges", "merges.txt"}, {"model", "spm.model"}};
  TokenizerRecord stored = record;
  stored.files.clear();
  if (files.empty()) return stored;
  fs::create_directories(staging / "tokenizer");
  for (const auto& [role, bytes] : files) {
    auto it = kNames.find(role);
    if (it == kNames.end()) throw std::logic_error("checkpoint: unknown tokenizer file role '" + role + "'");
    const std::string name = "tokenizer/" + it->second;
    write_file_durably((staging / name).string(), bytes);
    stored.files[role] = name;
  }
  fsync_path((staging / "tokenizer").string());
  return stored;
}

// Rank 0's index of the save, all but what the rank files' entries add at the commit.
CheckpointMeta index_skeleton(const CheckpointModel& m, const CheckpointProgress& progress, const std::string& id,
                              const fs::path& staging) {
  CheckpointMeta meta;
  meta.iteration = progress.iteration;
  meta.parent = progress.parent;
  meta.parent_id = progress.parent_id;
  meta.id = id;
  meta.consumed_samples = progress.consumed_samples;
  meta.optimizer_steps = progress.optimizer_steps;
  meta.rng_seed = progress.rng_seed;
  meta.loss_scaler_dynamic = progress.loss_scaler_dynamic;
  meta.loss_scaler = progress.loss_scaler;
  meta.dtype = m.dtype;
  meta.layout = SavedLayout{m.ps->tp_size(), m.ps->pp_size(), m.virtual_pipeline, m.ps->dp_size(),
                            m.ps->layout.world(), m.optimizer->distributed()};
  meta.vocab_size = m.vocab_size;
  meta.padded_vocab = m.padded_vocab;
  meta.tensors = m.global_shapes;
  meta.tensors.insert(m.fp8_shapes.begin(), m.fp8_shapes.end());
  meta.config_yaml = m.config_yaml;
  meta.tokenizer = store_tokenizer_files(m.tokenizer, m.tokenizer_files, staging);
  meta.has_optimizer_state = m.save_optimizer_state;
  return meta;
}

// Bytes of host memory the system can still give this process (MemAvailable of /proc/meminfo), or -1
// where it cannot be read.
int64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace

// The save between start() and its commit.
struct CheckpointSaver::Pending {
  Communicator* world = nullptr;
  int64_t iteration = 0;
  std::string id, staging;
  CheckpointMeta index;  // rank 0
  std::chrono::steady_clock::time_point started;
  double blocking_seconds = 0;
  int64_t snapshot_bytes = 0;
  bool in_background = false;  // this rank's write runs on the writer's thread
  bool fell_back = false;      // an asynchronous save this rank wrote synchronously: host memory was short
  RankWriteResult result;      // of a write done inside start()
};

CheckpointSaver::CheckpointSaver(Backend& backend, std::string dir, int64_t keep_last, bool async, int ranks_on_host)
    : backend_(backend),
      dir_(std::move(dir)),
      keep_last_(keep_last),
      async_(async),
      ranks_on_host_(std::max(1, ranks_on_host)),
      pool_(backend) {}

CheckpointSaver::~CheckpointSaver() { settle(); }

bool CheckpointSaver::snapshot_fits(int64_t floats) const {
  const int64_t grow = floats * static_cast<int64_t>(sizeof(float)) - pool_.bytes();
  if (grow <= 0) return true;
  // The ranks of a host grow their snapshots at the same moment: each may take its share of the half.
  const int64_t available = available_host_memory();
  return available < 0 || grow <= available / 2 / ranks_on_host_;
}

void CheckpointSaver::prepare(const CheckpointModel& m) {
  if (!async_ || pending_) return;
  std::vector<RankPiece> pieces = rank_pieces(m);
  const int64_t floats = layout_snapshot(pieces);
  if (floats > 0 && snapshot_fits(floats)) pool_.prepare(floats);
}

double CheckpointSaver::start(const CheckpointModel& m, const CheckpointProgress& progress) {
  if (pending_)
    throw std::logic_error(fmt::format("checkpoint {}: the save of iteration {} is still in flight", dir_,
                                       pending_->iteration));
  auto p = std::make_unique<Pending>();
  p->started = std::chrono::steady_clock::now();
  p->world = m.ps->world.get();
  p->iteration = progress.iteration;
  Communicator& world = *p->world;
  const std::string name = iteration_dir_name(progress.iteration);
  p->staging = (fs::path(dir_) / (name + ".tmp")).string();

  // A fresh staging directory (a crashed save may have left one behind), and the index's skeleton.
  std::string error;
  p->id = broadcast_string(world, world.rank() == 0 ? random_token() : "", 0);
  if (world.rank() == 0) {
    try {
      // A pruning still under way keeps its directories; its thread is waited for only once done.
      const bool deleting = deletions_running_ > 0;
      if (deleter_.joinable() && !deleting) deleter_.join();
      begin_checkpoint_dir(dir_, progress.iteration, !deleting);
      p->index = index_skeleton(m, progress, p->id, p->staging);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_on_checkpoint(world, error);

  // This rank's pieces: copied into the snapshot for the background, or written now.
  try {
    std::vector<RankPiece> pieces = rank_pieces(m);
    const int64_t floats = layout_snapshot(pieces);
    const std::string file = (fs::path(p->staging) / rank_file_name(m.ps->rank)).string();
    // A snapshot that would take more than this rank's share of half the memory still available is not
    // taken: this rank writes synchronously instead (the pool, once grown, is always used).
    p->fell_back = async_ && !snapshot_fits(floats);
    float* snapshot = nullptr;
    if (async_ && !p->fell_back && !pieces.empty()) {
      try {
        snapshot = pool_.reserve(floats);
      } catch (const std::exception&) {
        p->fell_back = true;  // the host memory could not be had after all: write synchronously
      }
    }
    if (snapshot) {
      copy_to_snapshot(backend_, pieces, snapshot);
      p->snapshot_bytes = floats * static_cast<int64_t>(sizeof(float));
      writer_.start(file, dir_, m.ps->rank, progress.iteration, std::move(pieces), snapshot);
      p->in_background = true;
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<float> host;
      auto values = [&](size_t i) -> const float* {
        const Tensor& t = *pieces[i].source;
        if (t.device() == Device::CPU && t.dtype() == DType::F32) return t.f32();
        host.resize(t.numel());  // device memory or a 16-bit dtype: through host fp32 (exact)
        backend_.download(t, host.data());
        return host.data();
      };
      try {
        p->result.file = write_rank_file(file, m.ps->rank, progress.iteration, pieces, values, p->result.wrote);
      } catch (const std::exception& e) {
        p->result.error = e.what();
      }
      p->result.seconds = seconds_since(t0);
    }
  } catch (const std::exception& e) {
    error = rank_prefix(world) + "saving checkpoint " + p->staging + ": " + e.what();
  }
  try {
    agree_on_checkpoint(world, error);
  } catch (...) {
    writer_.cancel();  // another rank failed: this rank's copy is never committed
    throw;
  }
  p->blocking_seconds = seconds_since(p->started);
  pending_ = std::move(p);
  return pending_->blocking_seconds;
}

std::optional<CheckpointSaveReport> CheckpointSaver::poll() {
  if (!pending_) return std::nullopt;
  // Any rank still writing, and any rank whose write failed.
  double state[2] = {pending_->in_background && !writer_.finished() ? 1.0 : 0.0, 0.0};
  if (pending_->in_background && writer_.finished()) {
    pending_->result = writer_.join();
    pending_->in_background = false;
  }
  state[1] = pending_->result.error.empty() ? 0.0 : 1.0;
  pending_->world->all_reduce_host(state, 2, ReduceOp::Max);
  if (state[1] == 0 && state[0] > 0) return std::nullopt;
  return commit();  // or the failure, on every rank
}

std::optional<CheckpointSaveReport> CheckpointSaver::wait() {
  if (!pending_) return std::nullopt;
  if (pending_->in_background) {
    pending_->result = writer_.join();
    pending_->in_background = false;
  }
  return commit();
}

void CheckpointSaver::settle() {
  if (deleter_.joinable()) deleter_.join();
}

CheckpointSaveReport CheckpointSaver::commit() {
  std::unique_ptr<Pending> p = std::move(pending_);  // whatever happens below, this save is over
  Communicator& world = *p->world;
  // A failed write on any rank: the same error everywhere; nothing is renamed, moved or pruned. Ranks
  // still writing cancel theirs.
  const std::string how = p->snapshot_bytes > 0 ? " (written in the background)" : "";
  try {
    agree_on_checkpoint(world, p->result.error.empty() ? ""
                                                       : rank_prefix(world) + "saving checkpoint " + p->staging + how +
                                                             ": " + p->result.error);
  } catch (...) {
    writer_.cancel();
    throw;
  }
  // Gathering the index entries is also the barrier that says every rank's data is durable.
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  const RankWriteResult& mine = p->result;
  std::string entry;
  try {
    entry = mine.wrote ? stored_file_to_yaml(mine.file) : "";
  } catch (const std::exception& e) {
    entry.clear();
    error = rank_prefix(world) + "saving checkpoint " + p->staging + ": " + e.what();
  }
  agree_on_checkpoint(world, error);
  std::vector<std::string> entries = all_gather_strings(world, entry);
  CheckpointSaveReport r;
  r.iteration = p->iteration;
  r.id = p->id;
  int64_t bytes = 0;
  if (world.rank() == 0) {
    try {
      CheckpointMeta& meta = p->index;
      meta.saved_at = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      for (size_t rank = 0; rank < entries.size(); ++rank) {
        if (entries[rank].empty()) continue;
        meta.files.push_back(stored_file_from_yaml(entries[rank], fmt::format("index entry of rank {}", rank)));
        bytes += meta.files.back().bytes;
        for (const StoredPiece& piece : meta.files.back().pieces) meta.master_weights |= piece.kind == "master";
      }
      bytes += static_cast<int64_t>(checkpoint_meta_to_yaml(meta).size());
      std::vector<std::string> doomed;
      r.path = commit_checkpoint_dir(dir_, meta, keep_last_, &r.notes, &doomed);
      // After the previous pruning's deletions, if they still run: the training thread never waits here.
      ++deletions_running_;
      deleter_ = std::thread([this, doomed, previous = std::move(deleter_)]() mutable {
        if (previous.joinable()) previous.join();
        std::error_code ec;  // what is left is deleted by a later save (remove_interrupted_saves)
        for (const std::string& d : doomed) fs::remove_all(d, ec);
        --deletions_running_;
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_on_checkpoint(world, error);
  r.path = broadcast_string(world, r.path, 0);
  // Totals over the world: bytes, snapshot bytes and ranks that fell back; the slowest rank's phases.
  double sums[3] = {static_cast<double>(bytes), static_cast<double>(p->snapshot_bytes), p->fell_back ? 1.0 : 0.0};
  world.all_reduce_host(sums, 3);
  double slowest[3] = {p->blocking_seconds, mine.seconds, seconds_since(t0)};
  world.all_reduce_host(slowest, 3, ReduceOp::Max);
  r.bytes = static_cast<int64_t>(sums[0]);
  r.snapshot_bytes = static_cast<int64_t>(sums[1]);
  r.async = r.snapshot_bytes > 0;  // some rank wrote in the background
  if (sums[2] > 0)
    r.notes.push_back(fmt::format("{} rank(s) wrote synchronously: their snapshot would have taken more than their "
                                  "share of half the host memory still available, or could not be allocated",
                                  static_cast<int64_t>(sums[2])));
  r.blocking_seconds = slowest[0];
  r.write_seconds = slowest[1];
  r.commit_seconds = slowest[2];
  r.seconds = seconds_since(p->started);
  return r;
}

CheckpointSaveReport save_distributed_checkpoint(const std::string& dir, const CheckpointModel& model,
                                                 const CheckpointProgress& progress, int64_t keep_last) {
  CheckpointSaver saver(*model.backend, dir, keep_last, false);
  saver.start(model, progress);
  return *saver.wait();
}

}  // namespace gpt
