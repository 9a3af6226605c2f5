// The on-disk format of a distributed checkpoint, with no MPI in it (docs/checkpoint-format.md).
// A checkpoint is a directory `iter_NNNNNNN/` holding one HDF5 file per writing rank (`rank_RRRRR.h5`)
// and `metadata.yaml` written by rank 0. Every stored dataset is a *piece*: a run of elements of one
// global tensor (kind "model", "master", "adam_m" or "adam_v"; global name and shape) described by the
// ShardSpec of the rank that wrote it and the range of that rank's local (tensor-parallel) shard it covers.
// Pieces are 1-D arrays of the local elements in order, so any reader can map each element to its global
// index with ShardSpec::global_index and take whatever part it needs, whatever its own layout.
// The metadata indexes every piece (file, kind, name, shard, range, dtype, CRC-32 of the stored bytes) and
// records training progress, loss-scaler state, the saved layout and the effective config.
// This header also owns the directory conventions: the `latest` pointer, atomic replacement, pruning.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/loss_scaler.h"
#include "model/parameter.h"

namespace gpt {

// Any checkpoint problem: the message names the checkpoint, the file and the tensor involved.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- element runs: how a stored or wanted range of a shard maps onto the global tensor ----

// `length` consecutive local elements starting at `local` that are consecutive in the global tensor too,
// starting at flat global index `global`.
struct ElementRun {
  int64_t global = 0, local = 0, length = 0;
};

// The local range [begin, end) of the shard `shard` of a tensor of shape `global` as maximal runs, in
// increasing global order (ShardSpec::global_index is increasing in the local index).
std::vector<ElementRun> shard_runs(const Shape& global, const ShardSpec& shard, int64_t begin, int64_t end);

// One copy from a stored piece into a wanted range: `length` elements from piece offset `src` (relative to
// the piece's first element) to wanted offset `dst` (relative to the wanted range's first element).
struct ElementCopy {
  int64_t src = 0, dst = 0, length = 0;
};
// The copies that move every element common to `stored` and `wanted` (both sorted by global index, as
// shard_runs returns them), with offsets relative to the first element of each side.
std::vector<ElementCopy> intersect_runs(const std::vector<ElementRun>& stored, int64_t stored_begin,
                                        const std::vector<ElementRun>& wanted, int64_t wanted_begin);

// CRC-32 (zlib's polynomial) of a byte buffer; crc32_update continues `crc` over more bytes, so
// crc32_update(crc32_bytes(a), b) is the CRC of a followed by b.
uint32_t crc32_bytes(const void* data, size_t bytes);
uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);

// ---- metadata ----

// Stored dtypes: "f32", "bf16", "f16" (model values are stored in the compute dtype, the rest in f32).
std::string stored_dtype_name(DType t);
DType stored_dtype_from_name(const std::string& name, const std::string& where);

struct StoredPiece {
  std::string kind;  // "model" | "master" | "adam_m" | "adam_v"
  std::string name;  // global tensor name
  ShardSpec shard;   // of the writing rank
  int64_t begin = 0, end = 0;  // range of the writer's local shard
  DType dtype = DType::F32;
  uint32_t crc32 = 0;  // of the stored little-endian bytes
  std::string dataset() const { return "/" + kind + "/" + name; }
};

struct StoredFile {
  std::string file;  // name inside the checkpoint directory
  int rank = 0;      // world rank that wrote it
  int64_t bytes = 0;  // file size after the final fsync
  std::vector<StoredPiece> pieces;
};

struct SavedLayout {
  int64_t tensor = 1, pipeline = 1, virtual_pipeline = 1, data = 1, world = 1;
  bool distributed_optimizer = false;
};

// The tokenizer the run's data was made with, so `gpt-train generate` can turn text into ids and back.
// `files` maps a role (vocab and merges for gpt2, model for spm) to a path relative to the checkpoint
// directory (tokenizer/...); bytes needs none. Absent (empty name) for synthetic data and older indexes.
struct TokenizerRecord {
  std::string name;  // bytes | gpt2 | spm
  std::string hash;  // Tokenizer::hash() of the vocabulary
  int64_t vocab_size = 0, eod_id = -1;
  std::map<std::string, std::string> files;
  bool empty() const { return name.empty(); }
};

struct CheckpointMeta {
  int64_t version = 1;
  int64_t iteration = 0, consumed_samples = 0, optimizer_steps = 0;
  // The checkpoint this one's run continued from: its previous save, or the checkpoint it resumed
  // (empty: it started fresh, or from a checkpoint outside its directory). Pruning follows these links,
  // so it only ever deletes this lineage's older checkpoints.
  std::string parent;
  // A random id of this checkpoint and the id of its parent: a parent name that now belongs to another
  // lineage's directory (after a rollback renamed the old one) is told apart. Empty in older indexes.
  std::string id, parent_id;
  double saved_at = 0;  // seconds since the epoch when it was committed (0: unknown, older indexes)
  bool has_optimizer_state = true;  // false for imported weights: moments start at zero
  bool master_weights = false;      // fp32 master copies are stored separately (compute dtype not fp32)
  std::string dtype = "fp32";       // precision.dtype of the run that saved
  bool loss_scaler_dynamic = false;
  LossScaler::State loss_scaler;
  SavedLayout layout;
  int64_t vocab_size = 0, padded_vocab = 0;
  // The whole random state: initialisation and synthetic data are counter-based functions of (seed,
  // tensor name, element index) and (seed, sample index), and the data order of the consumed samples.
  int64_t rng_seed = 0;
  std::map<std::string, Shape> tensors;  // global name -> global shape (every kind shares it)
  std::vector<StoredFile> files;
  std::string config_yaml;  // dump_config() of the saving run
  TokenizerRecord tokenizer;
};

std::string checkpoint_meta_to_yaml(const CheckpointMeta& meta);
// Throws CheckpointError naming `source` and the key when the text is not a valid checkpoint index.
CheckpointMeta checkpoint_meta_from_yaml(const std::string& text, const std::string& source);
// One file's index entry on its own (ranks send these to rank 0 as text).
std::string stored_file_to_yaml(const StoredFile& file);
StoredFile stored_file_from_yaml(const std::string& text, const std::string& source);

// Flattens a YAML document into "a.b.c" -> scalar text (sequences as "[x, y]"), for config comparison.
std::map<std::string, std::string> flatten_yaml(const std::string& text, const std::string& source);
// The model.* keys whose values differ between the config a checkpoint was saved with and this run's, as
// "model.hidden_size: checkpoint 32, this run 64" lines. The padding rule (make_vocab_size_divisible_by)
// is not compared: the loader handles any padding. A model key one side lacks (a checkpoint saved before
// the key existed) takes its value from `defaults_yaml` (the dump of a default config) when given there.
std::vector<std::string> model_config_differences(const std::string& saved_yaml, const std::string& current_yaml,
                                                  const std::string& defaults_yaml = {});
// Every key (any section) whose value differs, in the same form; for the log when resuming.
std::vector<std::string> config_differences(const std::string& saved_yaml, const std::string& current_yaml);

// ---- rank files ----

// Writes one rank's pieces into an HDF5 file (created fresh), computing each piece's CRC-32.
class ShardFileWriter {
 public:
  ShardFileWriter(const std::string& path, int rank, int64_t iteration);
  ~ShardFileWriter();
  // Stores local elements [begin, end) of the tensor `name` (shape `global`, sharded by `shard`):
  // `values` holds end - begin floats that are exact in `dtype` (they came from a tensor of that dtype).
  // Large pieces go in slabs of 16 MB, each under the process's HDF5 lock on its own, so a background
  // write never holds the lock for long (the data loader reads token shards through it); `cancel`,
  // when given and set, stops the write between slabs with a CheckpointError.
  void write(const std::string& kind, const std::string& name, const Shape& global, const ShardSpec& shard,
             int64_t begin, int64_t end, const float* values, DType dtype,
             const std::atomic<bool>* cancel = nullptr);
  // Closes the file, fsyncs it and returns its index entry (file name relative to its directory).
  StoredFile finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads pieces of a checkpoint for any layout. Files are opened on first use and kept open.
class CheckpointReader {
 public:
  CheckpointReader(std::string dir, const CheckpointMeta& meta);
  ~CheckpointReader();
  bool has(const std::string& kind, const std::string& name) const;
  // Pieces of these kinds are dropped from the page cache once read: for data no other rank will read,
  // keeping it cached only pushes out useful pages.
  void drop_after_reading(const std::set<std::string>& kinds);
  // Fills the local elements [begin, end) of this reader's shard `shard` of tensor `name` (this run's
  // global shape `global`) with every element the checkpoint holds for `kind`, leaving the others as they
  // are. Each overlapping piece is read whole and its CRC checked. Returns the number of elements filled.
  int64_t read(const std::string& kind, const std::string& name, const Shape& global, const ShardSpec& shard,
               int64_t begin, int64_t end, float* out);
  // Stored bytes read so far.
  int64_t bytes_read() const { return bytes_read_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t bytes_read_ = 0;
};

// How many of the local elements [begin, end) of `shard` (global shape `global`) have a flat global index
// below `limit` (the saved tensor's element count: rows past it are padding the checkpoint never had).
int64_t count_below(const Shape& global, const ShardSpec& shard, int64_t begin, int64_t end, int64_t limit);

// ---- directory conventions ----

std::string iteration_dir_name(int64_t iteration);  // "iter_0000010"
std::string rank_file_name(int rank);               // "rank_00003.h5"
constexpr const char* kMetadataFile = "metadata.yaml";
constexpr const char* kLatestFile = "latest";

// Writes `text` to `path` atomically and durably: `path`.tmp, fsync, rename, fsync of the directory.
void write_file_durably(const std::string& path, const std::string& text);
void fsync_path(const std::string& path);  // a file or a directory
std::string read_text_file(const std::string& path);
// 16 random hex digits: checkpoint ids and lock tokens.
std::string random_token();

// The checkpoint directory a load request names: `path` itself when it holds metadata.yaml, else the one
// its `latest` names. Empty when `path` has neither (or does not exist). Throws when `latest` does not
// hold the name of a complete `iter_NNNNNNN` directory (a `.tmp` staging directory is never loaded; the
// message shows the file's text escaped, never raw bytes).
std::string resolve_checkpoint(const std::string& path);
// The complete iteration directories in `dir` (`iter_NNNNNNN` holding metadata.yaml), newest first: the
// candidates when `latest` is missing.
std::vector<std::string> complete_checkpoints(const std::string& dir);
// `text` made safe for a message: printable ASCII kept, other bytes as \xNN, cut after `max` characters.
std::string printable(const std::string& text, size_t max = 80);

// The two ends of the commit protocol, run by one process (rank 0): begin creates a fresh staging
// directory dir/iter_NNNNNNN.tmp (clearing leftovers of interrupted saves) and returns its path; once
// every rank file in it is durable, commit writes metadata.yaml into it, fsyncs, renames it to
// iter_NNNNNNN, moves `latest` to it and prunes this lineage to keep_last. A complete iter_NNNNNNN
// already there (left by an abandoned lineage after a rollback) is never overwritten: it is renamed to
// iter_NNNNNNN.abandoned (then .abandoned.2, ...), which is never loaded or pruned. Returns the final
// directory; `notes` receives what the caller should log (abandoned and pruned directories).
// `remove_deletions` false leaves the NAME.deleting directories of a pruning still under way alone.
std::string begin_checkpoint_dir(const std::string& dir, int64_t iteration, bool remove_deletions = true);
// `doomed`: as for prune_lineage.
std::string commit_checkpoint_dir(const std::string& dir, const CheckpointMeta& meta, int64_t keep_last,
                                  std::vector<std::string>* notes = nullptr, std::vector<std::string>* doomed = nullptr);

// Deletes, of the lineage that ends at `newest` (that checkpoint and those its `parent` links reach in
// `dir`), every checkpoint beyond the newest `keep_last` (0 keeps all), never the one `latest` names.
// Checkpoints outside the lineage (an abandoned branch, another run's) are never touched. Returns the
// names deleted; `notes` receives a line per deletion and per deletion that failed (not an error: the
// newest checkpoint is committed already). With `doomed`, each one is only renamed to NAME.deleting
// (out of the complete names at once) and its path appended there, for the caller to delete off the
// training thread; a save deletes any left over (remove_interrupted_saves).
std::vector<std::string> prune_lineage(const std::string& dir, const std::string& newest, int64_t keep_last,
                                       std::vector<std::string>* notes = nullptr,
                                       std::vector<std::string>* doomed = nullptr);
// Removes leftover `iter_*.tmp` staging directories of interrupted saves, and (`deletions`) the
// `iter_*.deleting` ones of interrupted prunings.
void remove_interrupted_saves(const std::string& dir, bool deletions = true);

}  // namespace gpt
