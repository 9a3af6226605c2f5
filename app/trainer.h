// The training loop of one rank: builds this rank's model chunks from the config and the process grid,
// runs each step through the pipeline executor, reduces gradients (tied embedding, data parallel),
// clips by the global norm, steps AdamW, and logs Megatron-style lines plus the JSON metrics file.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "app/config.h"
#include "app/lr_schedule.h"
#include "data/sample_source.h"
#include "model/adamw.h"
#include "model/gpt_model.h"
#include "parallel/process_grid.h"

namespace gpt {

class MetricsWriter;
class DataParallelOptimizer;

struct StepStats {
  int64_t iteration = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  double seconds = 0;
};

class Trainer {
 public:
  Trainer(const Config& cfg, ParallelState& ps, Backend& backend);
  ~Trainer();
  // Runs training.train_iters steps (from the current iteration) and returns the per-step stats.
  std::vector<StepStats> train();
  // One optimizer step on the next global batch.
  StepStats step();
  // Mean token loss over `iters` global batches of `source` (same value on every rank).
  double evaluate(const SampleSource& source, int64_t iters);

  std::vector<ModelChunk*> chunks();
  const ModelSpec& spec() const { return spec_; }
  int64_t iteration() const { return iteration_; }
  int64_t consumed_samples() const { return consumed_; }
  // Every global parameter, assembled on every rank (tests and conversion): name -> values.
  std::vector<std::pair<std::string, std::vector<float>>> gather_global_params();

 private:
  void log_step(const StepStats& s);

  Config cfg_;
  ParallelState& ps_;
  Backend& backend_;
  ModelSpec spec_;
  std::vector<std::unique_ptr<ModelChunk>> chunks_;
  std::unique_ptr<DataParallelOptimizer> optimizer_;
  std::unique_ptr<SampleSource> train_source_;
  LrSchedule lr_;
  int64_t iteration_ = 0, consumed_ = 0;
  std::unique_ptr<MetricsWriter> metrics_;
};

ModelSpec model_spec_from_config(const Config& cfg, int tp_size, int tp_rank);

}  // namespace gpt
