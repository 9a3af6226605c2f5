// Distributed checkpoint save and load over a process grid (the format is in parallel/checkpoint/checkpoint_format.h
// and docs/checkpoint-format.md; saving, synchronous or in the background, in parallel/checkpoint/checkpoint_save.h).
// Save: every rank writes the pieces it owns, in parallel, into `iter_NNNNNNN.tmp/rank_RRRRR.h5` and
// fsyncs it: each optimizer segment (the whole parameter, or with ZeRO-1 this data-parallel rank's part)
// gives its model values, fp32 master weights (when distinct from the values) and Adam moments, written by
// data-parallel rank 0 only when the state is replicated over dp; tensor-parallel replicas are written by
// tp rank 0 only and the tied LM-head copy not at all. Rank 0 then writes metadata.yaml, renames the
// directory to `iter_NNNNNNN`, and only then moves `latest`. A crash at any point leaves the previous
// checkpoint as the one `latest` names.
// Load: rank 0 resolves the request, reads and checks the index (model config, tensor shapes, every rank
// file present with its saved size) and broadcasts it or the error, so every rank fails alike before any
// reads. Then each rank reads, from whichever files hold them, exactly the global elements its own layout
// needs (values for its whole local shards, optimizer state for its own segments). Any error on any rank
// is gathered and rethrown identically on all ranks.
#pragma once
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt_model.h"
#include "model/loss_scaler.h"
#include "parallel/checkpoint/checkpoint_format.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/grid/process_grid.h"

namespace gpt {

// This rank's model and optimizer as the checkpoint sees them.
struct CheckpointModel {
  ParallelState* ps = nullptr;
  Backend* backend = nullptr;
  std::vector<ModelChunk*> chunks;
  DataParallelOptimizer* optimizer = nullptr;
  std::string dtype = "fp32";          // precision.dtype
  int64_t virtual_pipeline = 1;
  int64_t vocab_size = 0, padded_vocab = 0;
  std::string config_yaml;             // dump_config() of this run
  std::string default_config_yaml;     // dump_config() of a default config: model keys older checkpoints lack
  // The run's tokenizer (empty for synthetic data) and its files' bytes by role (vocab, merges, model),
  // which rank 0 writes into the checkpoint's tokenizer/ directory; the record's `files` is filled then.
  TokenizerRecord tokenizer;
  std::map<std::string, std::string> tokenizer_files;
  std::map<std::string, Shape> global_shapes;  // every global tensor of the model, in this layout
  // FP8 scaling state (parallel/checkpoint/checkpoint_fp8.h): every global entry's shape, and this rank's
  // entries packed into F32 tensors on the backend at the time of the save (empty without precision.fp8).
  std::map<std::string, Shape> fp8_shapes;
  std::vector<std::pair<std::string, Tensor>> fp8_state;
  // Save the Adam moments (checkpoint.save_optimizer). Without them the checkpoint holds the weights
  // (and fp32 master weights) only: a third of the bytes, for release or evaluation; a run resumed from it
  // starts its moments at zero.
  bool save_optimizer_state = true;
  // Load the Adam moments, when the checkpoint has them (false: checkpoint.finetune); otherwise they start
  // at zero.
  bool load_optimizer_state = true;
};

// Scalars that travel with the tensors.
struct CheckpointProgress {
  int64_t iteration = 0, consumed_samples = 0, optimizer_steps = 0;
  int64_t rng_seed = 0;  // training.seed: with the consumed samples, the whole random state
  bool loss_scaler_dynamic = false;
  LossScaler::State loss_scaler;
  std::string parent;  // CheckpointMeta::parent: the previous checkpoint of this lineage in the same directory
  std::string parent_id;  // and its id
};

struct CheckpointSaveReport {
  std::string path;     // the complete iteration directory
  std::string id;       // its CheckpointMeta::id
  int64_t iteration = 0;
  int64_t bytes = 0;    // all rank files plus the metadata
  bool async = false;   // some rank wrote its file in the background
  // The slowest rank's time in each phase (parallel/checkpoint/checkpoint_save.h): blocked in start() (for an
  // asynchronous save, mostly the copy into host memory), writing its file (in the background, or
  // inside start() when synchronous) and the commit; and the bytes copied into host snapshots.
  double blocking_seconds = 0, write_seconds = 0, commit_seconds = 0;
  int64_t snapshot_bytes = 0;
  double seconds = 0;  // from start() to the end of the commit
  std::vector<std::string> notes;  // rank 0: directories set aside or pruned, ranks that wrote synchronously
};

// Collective over ps->world: a synchronous save (CheckpointSaver with async off, started and waited).
// Refuses (CheckpointError) to save model or master weights that are not finite. Writes
// checkpoint.dir/iter_NNNNNNN and moves `latest`; prunes to keep_last. Throws CheckpointError identically
// on every rank when any rank fails.
CheckpointSaveReport save_distributed_checkpoint(const std::string& dir, const CheckpointModel& model,
                                                 const CheckpointProgress& progress, int64_t keep_last);

struct CheckpointLoadReport {
  std::string path;  // the iteration directory that was loaded
  std::string note;  // for the log: why this one (e.g. `latest` was missing); empty normally
  CheckpointMeta meta;
  int64_t bytes_read = 0;  // stored bytes read by all ranks together
  double seconds = 0;
};

// Collective over ps->world. `path` is an iteration directory or a directory with a `latest` pointer (or,
// when that pointer is missing, complete iteration directories: the newest that verifies is loaded).
// Returns nullopt when there is nothing to load and `required` is false; otherwise loads every tensor into
// this rank's chunks and optimizer segments (the caller applies the progress in report.meta). Throws
// CheckpointError identically on every rank on any mismatch or damage.
std::optional<CheckpointLoadReport> load_distributed_checkpoint(const std::string& path, bool required,
                                                                const CheckpointModel& model);

// Shared by saving and loading: every rank passes its own error ("" when fine), and all throw the lowest
// failing rank's message as a CheckpointError, or none (collective over `comm`).
void agree_on_checkpoint(Communicator& comm, const std::string& error);
// Seconds on the steady clock since `t0`.
double seconds_since(std::chrono::steady_clock::time_point t0);

// The local element range [begin, end) of its parameter that an optimizer segment covers.
std::pair<int64_t, int64_t> segment_range(const OptimizerSegment& segment);

// Rank 0's checks of an index against the model before anyone reads (also used by tests): the model
// config, the tensor set and shapes, and every rank file present with the size it had when saved.
void validate_checkpoint(const std::string& dir, const CheckpointMeta& meta, const CheckpointModel& model);

}  // namespace gpt
