// The GPT model as this rank sees it: one ModelChunk per virtual pipeline stage it owns, each holding a
// contiguous range of transformer blocks, plus the embedding on the first virtual stage and the final
// norm, LM head (tied to the word embedding, or an untied output layer) and loss on the last. Chunks keep one activation cache per microbatch in
// flight, so any pipeline schedule can drive them through forward(mb) / backward(mb).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "model/embedding.h"
#include "model/fp8_scaling.h"
#include "model/norm.h"
#include "model/lm_head.h"
#include "model/model_description.h"
#include "model/transformer_block.h"

namespace gpt {

// The model this rank builds: the architecture (one ModelDescription, shared with the planner and the
// config) plus how this rank runs it.
struct ModelSpec : ModelDescription {
  int tp_size = 1, tp_rank = 0;
  DType dtype = DType::F32;
  Recompute recompute = Recompute::None;
  Fp8Recipe fp8;  // precision.fp8: the blocks' linear layers in FP8 (model/fp8_linear.h)
  // The run's padded vocabulary, a multiple of vocab_divisible_by * the run's tensor-parallel size; kept
  // when a copy describes the whole model on one rank (checkpoint shapes). 0: derive it from tp_size.
  int64_t padded_vocab_rows = 0;
  using ModelDescription::padded_vocab;
  int64_t padded_vocab() const { return padded_vocab_rows ? padded_vocab_rows : padded_vocab(tp_size); }
};

// Number of parameter tensors of the global model (a tied tensor counted once).
int64_t num_global_params(const ModelDescription& model);

// One microbatch's inputs: I32 [B*T] token ids and targets, on the backend's device.
struct Microbatch {
  Tensor tokens, targets;
  int64_t B = 0, T = 0;
};

class ModelChunk {
 public:
  // Blocks [layer_begin, layer_end); `first` adds the embedding, `last` the final layernorm and LM head.
  ModelChunk(const ModelSpec& spec, int64_t layer_begin, int64_t layer_end, bool first, bool last);
  ParameterSet& params() { return params_; }
  bool is_first() const { return embedding_.has_value(); }
  bool is_last() const { return head_ != nullptr; }
  // Allocates parameters in `dtype`, initialises them from (seed, name, index) and sets up the tied head.
  void allocate_and_init(Backend& backend, uint64_t seed, int64_t pad_multiple = 1);

  // Training forward of microbatch `mb`. First chunk reads mb.tokens, others `input` [B*T, C].
  // The last chunk computes the loss, adds the microbatch's mean token loss to *loss_sum (F64 [1] on the
  // device; required there) and its gradient scaled by grad_scale, and returns an undefined tensor; others
  // return their output activation.
  Tensor forward(LayerContext& ctx, int mb, const Microbatch& batch, const Tensor& input, float grad_scale,
                 Tensor* loss_sum);
  // Called by a backward pass with parameters whose gradients it has just completed.
  using GradsDone = std::function<void(const std::vector<Parameter*>&)>;
  // Backward of microbatch `mb`: the last chunk ignores grad_output. Returns the gradient wrt the chunk's
  // input (undefined for the first chunk). Frees the microbatch's cache. With grads_done (the step's last
  // backward pass of this chunk) each group of parameters is handed over as soon as its gradients are
  // complete: the final layernorm's and the LM head's (whose gradient the forward pass made), then each
  // block's from the last, then the embedding's.
  Tensor backward(LayerContext& ctx, int mb, const Microbatch& batch, const Tensor& grad_output,
                  const GradsDone* grads_done = nullptr);
  // Forward without caches or gradients (evaluation). Same input/output convention; the last chunk adds
  // the mean token loss to *loss_sum.
  Tensor eval_forward(LayerContext& ctx, const Microbatch& batch, const Tensor& input, Tensor* loss_sum);

  // ---- generation: the whole model in this chunk (first and last), tensor parallel size 1 ----
  // One sequence's key/value cache: per block, the packed qkv rows [capacity, 3*hidden] of the positions
  // decoded so far (`length` of them).
  struct KvCache {
    std::vector<Tensor> blocks;
    int64_t capacity = 0, length = 0;
  };
  KvCache make_kv_cache(Backend& backend, int64_t capacity) const;
  // Runs `tokens` (I32 [n]: positions cache.length .. cache.length + n - 1) through the model, appending
  // their keys and values to the cache, and returns the F32 logits [1, padded_vocab] of the last one. Each
  // call costs time linear in the cached length, per new token.
  Tensor decode(LayerContext& ctx, const Tensor& tokens, KvCache& cache);
  // F32 logits [B*T, padded_vocab] of every position of `batch` by the training forward, without a cache.
  Tensor logits(LayerContext& ctx, const Microbatch& batch);

  // Pipeline size 1 keeps the head's gradient of the tied embedding in its own buffer; this adds it into
  // the embedding's gradient (the same sum a pipeline does over the embedding group). Untied: nothing.
  void reduce_tied_gradient_locally(Backend& backend);
  int64_t hidden() const { return spec_.hidden; }
  DType activation_dtype() const { return spec_.dtype; }
  int64_t in_flight() const { return static_cast<int64_t>(caches_.size()); }
  // The FP8 scaling state of this chunk's linear layers (empty without precision.fp8). At the end of
  // each training iteration the caller max-reduces fp8_scales().pending() over the ranks that share the
  // layers (tensor, context and data parallel) and hands the result to fp8_scales().update().
  Fp8ScaleSet& fp8_scales() { return fp8_; }

 private:
  struct Cache {
    std::vector<BlockCache> blocks;
    Tensor final_in;    // input of the final layernorm
    Norm::Cache final_stats;
    Tensor head_dx;     // gradient wrt the final layernorm's output, computed in forward
  };
  // The blocks over x; the last block's residual add is left pending for the final norm or the stage output.
  Residual run_blocks(LayerContext& ctx, const Microbatch& b, Tensor x, Cache* cache);

  ModelSpec spec_;
  int64_t layer_begin_;
  ParameterSet params_;
  Fp8ScaleSet fp8_;  // before the blocks, which register their scales in it
  std::optional<GPTEmbedding> embedding_;
  std::vector<std::unique_ptr<TransformerBlock>> blocks_;
  std::optional<Norm> final_ln_;
  Parameter* head_weight_ = nullptr;  // the word embedding (same chunk), its tied copy, or the output layer
  std::unique_ptr<LMHeadLoss> head_;
  Tensor head_grad_;  // separate head gradient when the embedding lives in this chunk
  // The parameters of each part, in the groups backward() hands to GradsDone.
  std::vector<Parameter*> embedding_params_, final_params_;
  std::vector<std::vector<Parameter*>> block_params_;
  std::map<int, Cache> caches_;
};

}  // namespace gpt
