// The typed, validated configuration of one run. Loaded once at start-up from YAML (plus --set overrides),
// checked against a single key table (app/config_schema.cpp) so that an unknown key, a wrong type or an
// impossible value stops with an error naming the key and the file. The effective config is printed into
// the log and (later) stored in every checkpoint.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

struct ModelConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_heads = 4;
  int64_t ffn_hidden_size = 0;  // 0 = 4 * hidden_size
  int64_t seq_length = 64;
  int64_t vocab_size = 256;
  int64_t make_vocab_size_divisible_by = 128;  // padded vocab is a multiple of this * tensor parallel
  double layernorm_eps = 1e-5;
  double init_std = 0.02;
  std::string attention_backend = "auto";  // CUDA: auto | cudnn | unfused (the CPU has one fused attention)
  // Variants, named after Megatron-LM's flags (defaults: the GPT-2/GPT-3 model); see model/model_description.h.
  std::string position_embedding_type = "learned_absolute";  // learned_absolute | rope
  double rotary_base = 10000;
  double rotary_percent = 1.0;
  std::string normalization = "LayerNorm";  // LayerNorm | RMSNorm
  bool swiglu = false;
  int64_t num_query_groups = 0;  // 0 = num_heads (multi-head attention)
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;
};

struct ParallelConfig {
  int64_t tensor = 1;
  int64_t pipeline = 1;
  int64_t virtual_pipeline = 1;
  int64_t data = 0;  // 0 = world / (tensor * context * pipeline)
  int64_t context = 1;  // context-parallel size: each sequence's 2 * context chunks spread over this many ranks
  bool sequence_parallel = false;
  bool tp_comm_overlap = false;  // tensor-parallel all-gathers / reduce-scatters pipelined with the GEMMs (needs SP)
  bool distributed_optimizer = false;
  int64_t bucket_size_mb = 25;
  bool overlap_grad_reduce = true;  // start each gradient bucket's dp reduction during the last backward pass
  std::string communicator = "auto";  // device tensors across ranks: auto | nccl | mpi (host-staged)
};

struct TrainingConfig {
  int64_t micro_batch_size = 4;
  int64_t global_batch_size = 8;
  int64_t train_iters = 100;
  int64_t seed = 1234;
  std::string recompute = "none";  // none | selective | full
  int64_t threads = 0;             // 0 = OpenMP default
  double step_timeout_s = 600;     // watchdog: abort the job when one step (or eval batch) makes no progress; 0 = off
  double startup_timeout_s = 1800;  // watchdog: start-up (data, model, resume) and checkpoint save/load; 0 = off
  // Divergence stop (Megatron-LM's --check-for-nan-in-loss-and-grad): stop with an error after this many
  // consecutive steps with a non-finite loss or gradient (fp16 skips count only once the loss scale is at
  // its minimum); 0 = never stop.
  int64_t max_nonfinite_steps = 5;
  int64_t exit_interval = 0;       // stop, with a checkpoint, after an iteration divisible by this; 0 = off
  double exit_duration_mins = 0;   // stop, with a checkpoint, after the first step that ends past this; 0 = off
};

struct OptimizerConfig {
  double lr = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_iters = 10;
  int64_t decay_iters = 0;  // 0 = train_iters
  std::string lr_decay_style = "cosine";  // cosine | linear | constant | inverse-square-root
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double clip_grad = 1.0;  // 0 disables clipping
};

struct PrecisionConfig {
  std::string dtype = "fp32";  // fp32 | bf16 | fp16
  // FP8 linear layers (Transformer Engine's delayed scaling, model/fp8_scaling.h): off | e4m3 | hybrid.
  std::string fp8 = "off";
  int64_t fp8_amax_history_len = 1024;
  std::string fp8_amax_compute_algo = "max";  // max | most_recent
  int64_t fp8_margin = 0;
};

struct DataConfig {
  std::vector<std::string> train;  // empty = synthetic data
  std::vector<std::string> valid;
  std::string split = "969,30,1";
  std::string tokenizer = "bytes";
  std::string vocab_file;   // gpt2: vocab.json; spm: the .model (copied into checkpoints)
  std::string merges_file;  // gpt2: merges.txt
  std::string synthetic = "random";  // random | pattern (a repeating sequence, for memorization)
};

struct CheckpointConfig {
  std::string dir;
  int64_t save_interval = 0;
  int64_t keep_last = 2;
  std::string load;
  bool finetune = false;  // take only the weights from `load`: iteration 0, fresh optimizer state
  bool save_optimizer = true;  // false: save weights (and fp32 masters) only, no Adam moments
  double lock_stale_s = 300;   // a lock from another host not refreshed for this long is stale
  // Periodic saves copy this rank's shards to host memory and write them in the background while
  // training goes on (parallel/checkpoint/checkpoint_save.h); false: every save writes before training continues.
  bool async_save = true;
};

struct EvalConfig {
  int64_t interval = 0;
  int64_t iters = 10;
};

struct LoggingConfig {
  int64_t interval = 1;
  std::string metrics_file;
  std::string level = "info";
  bool all_ranks = false;
  double peak_tflops = 0;  // per device, for MFU; 0 = not reported
  std::string hardware;    // planner hardware for the start-up layout check (app/plan.h); empty = default
};

struct Config {
  std::string backend = "cpu";
  ModelConfig model;
  ParallelConfig parallel;
  TrainingConfig training;
  OptimizerConfig optimizer;
  PrecisionConfig precision;
  DataConfig data;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  LoggingConfig logging;
  std::string source = "<defaults>";  // file the config came from, for error messages

  // model.ffn_hidden_size, or Megatron-LM's default for the MLP (model/model_description.h).
  int64_t ffn_hidden() const;
};

// Thrown for any config problem; the message names the key and the source file.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Loads `path` (YAML), applies `overrides` ("key.path=value", typed as in YAML), expands ~ in path keys
// (app/config_paths.h), validates. Throws ConfigError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from an in-memory YAML string (tests); `source` names it in errors.
Config load_config_string(const std::string& yaml, const std::string& source,
                          const std::vector<std::string>& overrides = {});
// Checks values that do not depend on the world size (hidden % heads, ...). Throws ConfigError.
void validate_config(const Config& c);
// Every key with its current value, as YAML (used for the log, `gpt-train config --dump` and checkpoints).
std::string dump_config(const Config& c);

}  // namespace gpt
