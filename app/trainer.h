// The training loop of one rank: builds this rank's model chunks from the config and the process grid,
// runs each step through the pipeline executor, reduces gradients (tied embedding, sequence parallel,
// data parallel, the last overlapped with the backward pass), unscales and clips by the global norm, skips
// steps whose gradients overflowed, steps AdamW, evaluates at eval.interval, and logs Megatron-style lines
// plus the JSON metrics file. A step waits for the device once: for the download of its loss and
// gradient squares, which stay on the device until then.
#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/config.h"
#include "app/lr_schedule.h"
#include "data/sample_source.h"
#include "model/adamw.h"
#include "model/gpt_model.h"
#include "model/loss_scaler.h"
#include "parallel/checkpoint/checkpoint_format.h"
#include "parallel/grid/process_grid.h"

namespace gpt {

class MetricsWriter;
class DataParallelOptimizer;
class CheckpointSaver;
struct CheckpointSaveReport;

// The run stopped because too many consecutive steps were not finite (training.max_nonfinite_steps);
// raised alike on every rank.
struct TrainingDiverged : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct StepStats {
  int64_t iteration = 0;
  double loss = 0, grad_norm = 0, loss_scale = 1;
  double lr = 0;  // the rate this step applied (a skipped step: the one it would have applied)
  bool skipped = false;  // gradients overflowed: the weights were not updated
  double seconds = 0;
};

class Trainer {
 public:
  Trainer(const Config& cfg, ParallelState& ps, Backend& backend);
  ~Trainer();
  // Runs steps until training.train_iters (from the current iteration) and returns their stats.
  std::vector<StepStats> train();
  // One optimizer step on the next global batch.
  StepStats step();
  // Mean token loss over `iters` global batches of `source` (iters <= 0: one pass over the source);
  // the same value on every rank.
  double evaluate(const SampleSource& source, int64_t iters);
  // Evaluates the validation split and logs/records loss and perplexity; returns the loss.
  double evaluate_and_log(const std::string& split, int64_t iters);
  // The samples of a split: "train", "valid" or "test" of data.train (data.valid replaces "valid"),
  // or synthetic data when no shards are configured.
  std::unique_ptr<SampleSource> make_source(const std::string& split) const;

  std::vector<ModelChunk*> chunks();
  const ModelSpec& spec() const { return spec_; }
  const Config& config() const { return cfg_; }
  ParallelState& parallel_state() { return ps_; }
  Backend& backend() { return backend_; }
  DataParallelOptimizer& optimizer() { return *optimizer_; }
  LossScaler& loss_scaler() { return scaler_; }
  int64_t iteration() const { return iteration_; }
  const TokenizerRecord& tokenizer() const { return tokenizer_; }
  const std::map<std::string, std::string>& tokenizer_files() const { return tokenizer_files_; }
  int64_t consumed_samples() const { return consumed_; }
  void set_progress(int64_t iteration, int64_t consumed) { iteration_ = iteration, consumed_ = consumed; }
  // Distributed checkpoint (app/trainer_checkpoint.cpp): save writes checkpoint.dir/iter_NNNNNNN from every
  // rank and moves the `latest` pointer only once all ranks' data is durable (first committing a save
  // still in flight), and returns once it has; resume loads checkpoint.load, or the latest checkpoint
  // in checkpoint.dir, into this layout (any saved layout); returns false when there is nothing to load.
  void save_checkpoint();
  bool resume();
  // The host memory held for asynchronous checkpoint snapshots (0 before the first or with sync saves).
  int64_t checkpoint_host_buffer_bytes() const;
  // The ranks on this process's host (the launch environment's local size), which share its memory for
  // checkpoint snapshots; 1 unless set.
  void set_ranks_on_host(int ranks) { ranks_on_host_ = ranks; }
  // Every global parameter, assembled on every rank (tests and conversion): name -> values.
  // With `gradients`, their gradients instead (once reduced over the data-parallel group, without the
  // distributed optimizer, whose ranks hold only their shard's sums).
  std::vector<std::pair<std::string, std::vector<float>>> gather_global_params(bool gradients = false);

 private:
  // The layers' view of this rank's groups and of the parallel options.
  LayerContext layer_context();
  void log_interval(const StepStats& last);
  // Counts `s` towards training.max_nonfinite_steps; true when the run must stop.
  bool count_nonfinite(const StepStats& s);
  [[noreturn]] void throw_diverged(const StepStats& s);
  // Starts a checkpoint of this iteration unless the current run of non-finite steps is under way; true
  // when it did.
  bool save_unless_nonfinite();
  // Starts a save of this iteration after committing the one in flight: written in the background with
  // checkpoint.async_save, else committed before it returns.
  void start_checkpoint();
  // Sets up the snapshot buffer of asynchronous saves in the background (CheckpointSaver::prepare).
  void prepare_checkpoint_buffer();
  // After a step (collective): commits a save in flight once every rank's write is done.
  void poll_checkpoint();
  // Waits for the save in flight, if any, and commits it (collective).
  void finish_checkpoint();
  void checkpoint_committed(const CheckpointSaveReport& r);
  CheckpointSaver& saver();  // created at first use

  Config cfg_;
  ParallelState& ps_;
  Backend& backend_;
  ModelSpec spec_;
  std::vector<std::unique_ptr<ModelChunk>> chunks_;
  std::unique_ptr<DataParallelOptimizer> optimizer_;
  Tensor step_sums_;  // F64 [1 + global parameters] on the device: the step's loss and gradient squares
  std::unique_ptr<SampleSource> train_source_;
  LossScaler scaler_ = LossScaler::constant();
  LrSchedule lr_;
  int64_t iteration_ = 0, consumed_ = 0;
  std::string lineage_parent_;     // the checkpoint of checkpoint.dir this run continues: resumed or last saved
  std::string lineage_parent_id_;  // its CheckpointMeta::id
  int64_t nonfinite_streak_ = 0;   // consecutive steps that count towards training.max_nonfinite_steps
  bool resume_attempted_ = false;  // train() auto-resumes once, unless resume() was called already
  std::string resumed_without_moments_;  // the checkpoint loaded, when it held no Adam moments
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();  // for exit_duration_mins
  std::unique_ptr<MetricsWriter> metrics_;
  // What checkpoints record of the data's tokenizer, and its files' bytes (trainer_checkpoint.cpp); set on
  // rank 0 of a run that saves checkpoints.
  TokenizerRecord tokenizer_;
  std::map<std::string, std::string> tokenizer_files_;
  // Since the last log line: steps, seconds, loss sum, skipped steps, communication seconds and bytes.
  struct Interval {
    int64_t steps = 0, skipped = 0;
    double seconds = 0, loss_sum = 0;
    double comm_seconds[4] = {0, 0, 0, 0};  // tp, pp, dp, cp
    int64_t comm_bytes[4] = {0, 0, 0, 0};
  } interval_;
  int ranks_on_host_ = 1;
  // Checkpoint saves, created at the first; declared last, so a write in flight when the trainer goes
  // (a failing run) is cancelled before anything it reads is destroyed.
  std::unique_ptr<CheckpointSaver> saver_;
};

// The tokenizer of the configured data (empty for synthetic data): name, hash, vocabulary and end-of-
// document id from the shards; with data.vocab_file / data.merges_file set, their bytes by role (vocab,
// merges, model) in *files, once checked to be the tokenizer the shards were made with. Throws
// ConfigError naming the key otherwise.
TokenizerRecord tokenizer_record_from_config(const Config& cfg, std::map<std::string, std::string>* files);

// The samples of a split: "train", "valid" or "test" of data.train (data.valid replaces "valid"), or
// synthetic data when no shards are configured.
std::unique_ptr<SampleSource> make_sample_source(const Config& cfg, const std::string& split);

}  // namespace gpt
