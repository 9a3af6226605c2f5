// The config key table (see app/config_schema.h) and the look-ups on it: exact find, section test, the
// closest key to a typo (edit distance, or the same leaf name in another section) and type names.
#include "app/config_schema.h"

#include <algorithm>
#include <limits>

namespace gpt {

// One row per key. The lambda is captureless, so it decays to the plain function pointer ConfigKey holds;
// the pointer it returns carries the field's C++ type, so the table cannot disagree with the struct.
#define GPT_KEY(section, name, help, ...) \
  ConfigKey { #section "." #name, [](Config& c) -> ConfigField { return &c.section.name; }, help, {__VA_ARGS__} }
#define GPT_TOP_KEY(name, help, ...) \
  ConfigKey { #name, [](Config& c) -> ConfigField { return &c.name; }, help, {__VA_ARGS__} }
// A key whose value is a path (or, for a list, data spec words that are paths or weights).
#define GPT_PATH_KEY(section, name, help) \
  ConfigKey { #section "." #name, [](Config& c) -> ConfigField { return &c.section.name; }, help, {}, true }

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = {
      GPT_TOP_KEY(backend, "compute backend", "cpu", "cuda"),

      GPT_KEY(model, num_layers, "transformer layers"),
      GPT_KEY(model, hidden_size, "width of the residual stream"),
      GPT_KEY(model, num_heads, "attention heads per layer"),
      GPT_KEY(model, ffn_hidden_size, "MLP inner width; 0 = 4 * hidden_size (SwiGLU: see model.swiglu)"),
      GPT_KEY(model, seq_length, "tokens per sample"),
      GPT_KEY(model, vocab_size, "tokenizer vocabulary size (before padding)"),
      GPT_KEY(model, make_vocab_size_divisible_by, "padded vocab is a multiple of this times parallel.tensor"),
      GPT_KEY(model, layernorm_eps, "epsilon inside layer norm"),
      GPT_KEY(model, init_std, "standard deviation of the normal weight initialisation"),
      GPT_KEY(model, attention_backend,
              "CUDA attention: cuDNN's fused attention where it takes the shape, else the unfused path with one "
              "warning (auto); cuDNN or an error (cudnn); the unfused path (unfused). The CPU backend has one "
              "fused attention and ignores it",
              "auto", "cudnn", "unfused"),
      GPT_KEY(model, position_embedding_type,
              "learned position table (learned_absolute) or rotary embeddings of queries and keys (rope)",
              "learned_absolute", "rope"),
      GPT_KEY(model, rotary_base, "RoPE: theta_i = rotary_base^(-2i/rotary_dims)"),
      GPT_KEY(model, rotary_percent, "RoPE: share (0, 1] of each head's dims that rotate"),
      GPT_KEY(model, normalization, "the blocks' and the final norm", "LayerNorm", "RMSNorm"),
      GPT_KEY(model, swiglu,
              "SwiGLU MLP: fc2(silu(x W_gate) * x W_up); ffn_hidden_size 0 then means 2/3 * 4 * hidden_size "
              "rounded down to a multiple of 64"),
      GPT_KEY(model, num_query_groups,
              "key/value heads of grouped-query attention, dividing num_heads and divisible by parallel.tensor; "
              "0 = num_heads (multi-head attention)"),
      GPT_KEY(model, untie_embeddings_and_output_weights,
              "a separate output layer on the last stage instead of the word embedding"),
      GPT_KEY(model, add_bias_linear, "biases on the qkv, projection and MLP linears (false = --disable-bias-linear)"),

      GPT_KEY(parallel, tensor, "tensor-parallel size"),
      GPT_KEY(parallel, pipeline, "pipeline-parallel size (stages)"),
      GPT_KEY(parallel, virtual_pipeline, "model chunks per pipeline stage (interleaved schedule when > 1)"),
      GPT_KEY(parallel, data, "data-parallel size; 0 = world / (tensor * context * pipeline)"),
      GPT_KEY(parallel, context,
              "context-parallel size: each sequence is cut into 2 x context chunks, rank r of the group holding "
              "chunks r and 2 x context - 1 - r, with ring attention between them"),
      GPT_KEY(parallel, sequence_parallel, "shard layer norm / dropout activations over the tensor group"),
      GPT_KEY(parallel, tp_comm_overlap,
              "split each transformer layer's tensor-parallel all-gather and reduce-scatter into row blocks "
              "pipelined with the neighbouring GEMM's blocks (Megatron's --tp-comm-overlap); needs "
              "parallel.sequence_parallel. FP8 layers keep the plain collectives"),
      GPT_KEY(parallel, distributed_optimizer, "shard optimizer state over the data-parallel group"),
      GPT_KEY(parallel, bucket_size_mb, "gradient all-reduce bucket size in MiB"),
      GPT_KEY(parallel, overlap_grad_reduce,
              "start each gradient bucket's data-parallel all-reduce (reduce-scatter with the distributed "
              "optimizer) during the last microbatch's backward pass, as soon as its gradients are complete "
              "(Megatron's --overlap-grad-reduce); false: reduce after the backward pass"),

      GPT_KEY(parallel, communicator,
              "how a GPU backend moves tensors between ranks: NCCL, one GPU per rank (nccl); MPI through host "
              "memory, which lets several ranks share one GPU, slowly (mpi); NCCL when built in, else mpi with "
              "a warning (auto). The CPU backend always uses MPI",
              "auto", "nccl", "mpi"),

      GPT_KEY(training, micro_batch_size, "samples per microbatch per data-parallel rank"),
      GPT_KEY(training, global_batch_size, "samples per optimizer step over all data-parallel ranks"),
      GPT_KEY(training, train_iters, "optimizer steps to run"),
      GPT_KEY(training, seed, "seed for weight initialisation and data order"),
      GPT_KEY(training, recompute, "activation recomputation", "none", "selective", "full"),
      GPT_KEY(training, threads, "CPU threads per rank; 0 = OpenMP default"),
      GPT_KEY(training, step_timeout_s,
              "abort the job, naming the stalled rank, when a training step or an evaluation batch makes no "
              "progress for this long; 0 = never"),
      GPT_KEY(training, startup_timeout_s,
              "abort the job, naming the stalled rank, when start-up (data, model, resume) or a checkpoint save "
              "or load takes longer; 0 = never"),
      GPT_KEY(training, max_nonfinite_steps,
              "stop with an error after this many consecutive steps whose loss or gradients are not finite "
              "(fp16 overflow skips count only at the minimum loss scale), as Megatron-LM's "
              "--check-for-nan-in-loss-and-grad; 0 = never"),
      GPT_KEY(training, exit_interval,
              "stop with a checkpoint after an iteration divisible by this (Megatron-LM's --exit-interval); 0 = never"),
      GPT_KEY(training, exit_duration_mins,
              "stop with a checkpoint after the first step that ends this many minutes after start-up "
              "(Megatron-LM's --exit-duration-in-mins); 0 = never"),

      GPT_KEY(optimizer, lr, "peak learning rate"),
      GPT_KEY(optimizer, min_lr, "learning rate at the end of the decay (the floor of inverse-square-root)"),
      GPT_KEY(optimizer, warmup_iters, "linear warm-up steps from rate 0 (iteration 1 runs at 0, as in Megatron-LM)"),
      GPT_KEY(optimizer, decay_iters, "iteration at which the decay reaches min_lr; 0 = training.train_iters"),
      GPT_KEY(optimizer, lr_decay_style, "learning-rate decay after warm-up, as Megatron-LM's --lr-decay-style",
              "cosine", "linear", "constant", "inverse-square-root"),
      GPT_KEY(optimizer, weight_decay, "AdamW decoupled weight decay"),
      GPT_KEY(optimizer, beta1, "AdamW first-moment decay"),
      GPT_KEY(optimizer, beta2, "AdamW second-moment decay"),
      GPT_KEY(optimizer, eps, "AdamW denominator epsilon"),
      GPT_KEY(optimizer, clip_grad, "global gradient-norm clip; 0 disables clipping"),

      GPT_KEY(precision, dtype, "compute dtype (master weights stay fp32)", "fp32", "bf16", "fp16"),
      GPT_KEY(precision, fp8,
              "the transformer blocks' linear GEMMs in FP8 with delayed per-tensor scaling: E4M3 everywhere "
              "(e4m3) or E5M2 gradients (hybrid); attention, norms and the LM head stay in precision.dtype",
              "off", "e4m3", "hybrid"),
      GPT_KEY(precision, fp8_amax_history_len, "FP8: iterations of amax history the scales are computed from"),
      GPT_KEY(precision, fp8_amax_compute_algo, "FP8: the history's largest amax (max) or the newest (most_recent)",
              "max", "most_recent"),
      GPT_KEY(precision, fp8_margin, "FP8: scale = (fp8_max / amax) / 2^margin"),

      GPT_PATH_KEY(data, train, "training token shards (paths, prefixes or weight/path pairs); empty = synthetic data"),
      GPT_PATH_KEY(data, valid, "validation token shards; empty = split off the training data"),
      GPT_KEY(data, split, "train,valid,test weights for splitting the training data"),
      GPT_KEY(data, tokenizer, "tokenizer name"),
      GPT_PATH_KEY(data, vocab_file,
                   "the tokenizer's file (gpt2: vocab.json; spm: the .model), checked against the shards and copied "
                   "into every checkpoint for `gpt-train generate`; empty = checkpoints record the tokenizer's name "
                   "and hash only (enough for bytes)"),
      GPT_PATH_KEY(data, merges_file, "gpt2: merges.txt, with data.vocab_file"),
      GPT_KEY(data, synthetic, "synthetic data kind when data.train is empty", "random", "pattern"),

      GPT_PATH_KEY(checkpoint, dir, "directory checkpoints are saved in; empty = no saving"),
      GPT_KEY(checkpoint, save_interval, "save every this many steps; 0 = no periodic saves"),
      GPT_KEY(checkpoint, keep_last, "saved iterations to keep; 0 = keep all"),
      GPT_KEY(checkpoint, async_save,
              "copy each save's shards to host memory (pinned on CUDA; one buffer reused by every save) and write "
              "them in the background while training goes on; `latest` moves only once every rank's files are "
              "durable, and a failed write stops the run at the next step. A rank whose copy would take more "
              "than its share of half the host memory still available writes synchronously. false: training "
              "waits for every save"),
      GPT_PATH_KEY(checkpoint, load, "checkpoint directory to resume from; empty = start fresh"),
      GPT_KEY(checkpoint, save_optimizer,
              "save the Adam moments; false = weights and fp32 master weights only, a third of the size, for "
              "release or evaluation (Megatron-LM's --no-save-optim); resuming such a checkpoint restarts the moments"),
      GPT_KEY(checkpoint, lock_stale_s,
              "the run holds checkpoint.dir/gpt-train.lock; a lock of another host not refreshed for this many "
              "seconds is stale and taken over (on the same host: when its process is gone)"),
      GPT_KEY(checkpoint, finetune,
              "take only the weights from checkpoint.load and start at iteration 0 with fresh optimizer state, "
              "loss scale and data order (Megatron-LM's --finetune); a restart resumes checkpoint.dir as usual"),

      GPT_KEY(eval, interval, "evaluate every this many steps; 0 = never"),
      GPT_KEY(eval, iters, "batches per evaluation"),

      GPT_KEY(logging, interval, "log every this many steps"),
      GPT_PATH_KEY(logging, metrics_file, "JSON-lines metrics file; empty = none"),
      GPT_KEY(logging, level, "log level", "trace", "debug", "info", "warn", "error", "critical", "off"),
      GPT_KEY(logging, all_ranks, "every rank logs, not only rank 0"),
      GPT_KEY(logging, peak_tflops, "peak TFLOP/s per device for MFU; 0 = MFU not reported"),
      GPT_PATH_KEY(logging, hardware, "hardware for the start-up layout check: a100-80g, h100-80g, h200 or a file; empty = h100-80g on cuda, none on cpu"),
  };
  return keys;
}

#undef GPT_KEY
#undef GPT_TOP_KEY
#undef GPT_PATH_KEY

const ConfigKey* find_config_key(std::string_view path) {
  for (const ConfigKey& key : config_keys()) {
    if (path == key.path) return &key;
  }
  return nullptr;
}

bool is_config_section(std::string_view name) {
  for (const ConfigKey& key : config_keys()) {
    std::string_view p = key.path;
    if (p.size() > name.size() && p.substr(0, name.size()) == name && p[name.size()] == '.') return true;
  }
  return false;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

namespace {

std::string_view leaf_name(std::string_view path) {
  size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

}  // namespace

std::string closest_config_key(std::string_view path) {
  // Candidates: every key and every section name (a misspelt section has no dot).
  std::vector<std::string> candidates;
  for (const ConfigKey& key : config_keys()) {
    std::string p = key.path;
    candidates.push_back(p);
    size_t dot = p.find('.');
    if (dot != std::string::npos) candidates.push_back(p.substr(0, dot));
  }
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& candidate : candidates) {
    size_t d = edit_distance(path, candidate);
    // The right leaf under the wrong section ("training.lr") is as good as a one-letter typo.
    if (path.find('.') != std::string_view::npos && candidate.find('.') != std::string::npos &&
        leaf_name(path) == leaf_name(candidate))
      d = std::min<size_t>(d, 1);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  size_t tolerance = std::max<size_t>(2, path.size() / 4);
  return best_distance <= tolerance ? best : std::string();
}

const char* config_type_name(const ConfigField& field) {
  struct Namer {
    const char* operator()(int64_t*) const { return "int"; }
    const char* operator()(double*) const { return "float"; }
    const char* operator()(bool*) const { return "bool"; }
    const char* operator()(std::string*) const { return "string"; }
    const char* operator()(std::vector<std::string>*) const { return "list of strings"; }
  };
  return std::visit(Namer{}, field);
}

}  // namespace gpt
