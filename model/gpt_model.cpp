// Model chunks: construction in canonical parameter order, the tied or untied LM head, and per-microbatch
// forward/backward through embedding, blocks, final norm and loss.
#include "model/gpt_model.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace gpt {

namespace {
// Canonical (layout-independent) parameter ids: the embedding's tensors, then each block's in
// registration order, then the final norm's, then the untied output layer.
int64_t embedding_param_count(const ModelDescription& m) { return m.has_position_table() ? 2 : 1; }
int64_t norm_param_count(const ModelDescription& m) { return m.has_norm_bias() ? 2 : 1; }
int64_t block_param_count(const ModelDescription& m) {
  return 2 * norm_param_count(m) + 4 * (m.add_bias_linear ? 2 : 1);  // ln1, qkv, proj, ln2, fc1, fc2
}
int64_t final_norm_first_id(const ModelDescription& m) {
  return embedding_param_count(m) + block_param_count(m) * m.num_layers;
}
}  // namespace

int64_t num_global_params(const ModelDescription& m) {
  return final_norm_first_id(m) + norm_param_count(m) + (m.untie_embeddings ? 1 : 0);
}

ModelChunk::ModelChunk(const ModelSpec& s, int64_t layer_begin, int64_t layer_end, bool first, bool last)
    : spec_(s), layer_begin_(layer_begin), fp8_(s.fp8) {
  auto assign_ids = [&](size_t from, int64_t first_id) {
    auto& ps = params_.params();
    for (size_t i = from; i < ps.size(); ++i) ps[i]->global_id = first_id + int64_t(i - from);
  };
  auto registered_since = [&](size_t from) {
    std::vector<Parameter*> out;
    for (size_t i = from; i < params_.params().size(); ++i) out.push_back(params_.params()[i].get());
    return out;
  };
  const ShardSpec vocab_shard{0, 1, s.tp_size, s.tp_rank};
  if (first) {
    embedding_.emplace(params_, EmbeddingSpec{s.padded_vocab(), s.hidden, s.seq_length, s.has_position_table(),
                                              s.init_std, s.tp_size, s.tp_rank});
    assign_ids(0, 0);
    embedding_->word()->tied = !s.untie_embeddings;
    embedding_params_ = registered_since(0);
  }
  const BlockSpec bs{s, s.tp_size, s.tp_rank, &fp8_};
  for (int64_t l = layer_begin; l < layer_end; ++l) {
    size_t before = params_.params().size();
    blocks_.push_back(std::make_unique<TransformerBlock>(params_, "layers." + std::to_string(l), bs));
    assign_ids(before, embedding_param_count(s) + block_param_count(s) * l);
    block_params_.push_back(registered_since(before));
  }
  if (last) {
    size_t before = params_.params().size();
    final_ln_.emplace(params_, "final_ln", s.hidden, s.eps, s.normalization);
    assign_ids(before, final_norm_first_id(s));
    if (s.untie_embeddings) {
      // Megatron's untied output layer: its own weight, on the last stage only, with no embedding group.
      head_weight_ = &params_.add("output_layer.weight", {s.padded_vocab(), s.hidden}, vocab_shard, true, false);
      head_weight_->init = {true, s.init_std, 0.f};
      head_weight_->global_id = final_norm_first_id(s) + norm_param_count(s);
    } else if (first) {
      head_weight_ = embedding_->word();
    } else {
      head_weight_ = &params_.add("embedding.word_embeddings.weight", {s.padded_vocab(), s.hidden}, vocab_shard,
                                  true, false);
      head_weight_->init = {true, s.init_std, 0.f};
      head_weight_->tied_copy = true;
      head_weight_->tied = true;
      head_weight_->global_id = 0;
    }
    final_params_ = registered_since(before);
  }
}

void ModelChunk::allocate_and_init(Backend& backend, uint64_t seed, int64_t pad_multiple) {
  params_.allocate(backend, spec_.dtype, pad_multiple);
  for (auto& p : params_.params()) init_parameter(backend, *p, seed);
  if (head_weight_) {
    int64_t vocab_start = spec_.tp_rank * (spec_.padded_vocab() / spec_.tp_size);
    Tensor grad = head_weight_->grad;
    if (is_first() && head_weight_ == embedding_->word()) {
      head_grad_ = backend.zeros(head_weight_->grad.shape());
      grad = head_grad_;
    }
    head_ = std::make_unique<LMHeadLoss>(head_weight_, grad, spec_.vocab_size, vocab_start);
  }
}

void ModelChunk::reduce_tied_gradient_locally(Backend& backend) {
  if (!head_grad_.defined()) return;
  backend.accumulate(head_grad_, embedding_->word()->grad);
  backend.fill(head_grad_, 0.f);
}

Residual ModelChunk::run_blocks(LayerContext& ctx, const Microbatch& b, Tensor x, Cache* cache) {
  Residual r{std::move(x), Tensor()};
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Residual y;
    if (cache) {
      blocks_[i]->forward(ctx, std::move(r), b.B, b.T, y, cache->blocks[i], spec_.recompute);
    } else {
      BlockCache scratch;
      blocks_[i]->forward(ctx, std::move(r), b.B, b.T, y, scratch);
    }
    r = std::move(y);
  }
  return r;
}

Tensor ModelChunk::forward(LayerContext& ctx, int mb, const Microbatch& b, const Tensor& input, float grad_scale,
                           Tensor* loss_sum) {
  if (caches_.count(mb)) throw std::logic_error("ModelChunk::forward: microbatch " + std::to_string(mb) + " already in flight");
  Cache& c = caches_[mb];
  c.blocks.resize(blocks_.size());
  Tensor x = input;
  if (is_first()) embedding_->forward(ctx, b.tokens, b.T, x, spec_.dtype);
  Residual out = run_blocks(ctx, b, std::move(x), &c);
  if (!is_last()) return materialise(ctx.backend, std::move(out));
  Tensor normed;
  final_ln_->forward_residual(ctx, std::move(out), c.final_in, normed, c.final_stats);
  if (!loss_sum) throw std::invalid_argument("ModelChunk::forward: the last chunk needs a loss accumulator");
  head_->forward_backward(ctx, normed, b.targets, grad_scale, c.head_dx, *loss_sum);
  return Tensor();
}

Tensor ModelChunk::backward(LayerContext& ctx, int mb, const Microbatch& b, const Tensor& grad_output,
                            const GradsDone* grads_done) {
  auto it = caches_.find(mb);
  if (it == caches_.end()) throw std::logic_error("ModelChunk::backward: microbatch " + std::to_string(mb) + " has no forward");
  auto done = [&](const std::vector<Parameter*>& params) {
    if (grads_done && !params.empty()) (*grads_done)(params);
  };
  Cache& c = it->second;
  Tensor dx = grad_output;
  if (is_last()) {
    final_ln_->backward(ctx, c.head_dx, c.final_in, c.final_stats, dx);
    done(final_params_);
  }
  for (size_t i = blocks_.size(); i-- > 0;) {
    Tensor dinput;
    blocks_[i]->backward(ctx, dx, b.B, b.T, c.blocks[i], dinput, spec_.recompute);
    dx = dinput;
    done(block_params_[i]);
  }
  caches_.erase(it);
  if (is_first()) {
    embedding_->backward(ctx, b.tokens, dx, b.T);
    done(embedding_params_);
    return Tensor();
  }
  return dx;
}

Tensor ModelChunk::eval_forward(LayerContext& ctx, const Microbatch& b, const Tensor& input, Tensor* loss_sum) {
  Tensor x = input;
  if (is_first()) embedding_->forward(ctx, b.tokens, b.T, x, spec_.dtype);
  Residual out = run_blocks(ctx, b, std::move(x), nullptr);
  if (!is_last()) return materialise(ctx.backend, std::move(out));
  Tensor normed, sum;
  Norm::Cache stats;
  final_ln_->forward_residual(ctx, std::move(out), sum, normed, stats);
  if (!loss_sum) throw std::invalid_argument("ModelChunk::eval_forward: the last chunk needs a loss accumulator");
  head_->forward(ctx, normed, b.targets, *loss_sum);
  return Tensor();
}

namespace {
void require_whole_model(const ModelChunk& chunk, const LayerContext& ctx, const char* what) {
  if (!chunk.is_first() || !chunk.is_last() || ctx.tp.size() != 1)
    throw std::logic_error(std::string("ModelChunk::") + what +
                           " needs the whole model in one chunk (pipeline and tensor parallel size 1)");
}
}  // namespace

ModelChunk::KvCache ModelChunk::make_kv_cache(Backend& backend, int64_t capacity) const {
  if (capacity <= 0 || capacity > spec_.seq_length)
    throw std::invalid_argument("key/value cache: capacity " + std::to_string(capacity) +
                                " must be between 1 and seq_length " + std::to_string(spec_.seq_length));
  KvCache cache;
  cache.capacity = capacity;
  for (size_t i = 0; i < blocks_.size(); ++i)
    cache.blocks.push_back(backend.empty({capacity, spec_.qkv_width() / spec_.tp_size}, spec_.dtype));
  return cache;
}

Tensor ModelChunk::decode(LayerContext& ctx, const Tensor& tokens, KvCache& cache) {
  require_whole_model(*this, ctx, "decode");
  const int64_t n = tokens.numel();
  if (n <= 0 || cache.length + n > cache.capacity)
    throw std::invalid_argument("decode: " + std::to_string(n) + " new token(s) after " +
                                std::to_string(cache.length) + " do not fit the cache of " +
                                std::to_string(cache.capacity) + " positions");
  Tensor embedded;
  embedding_->forward(ctx, tokens, n, embedded, spec_.dtype, cache.length);
  Residual x{std::move(embedded), Tensor()};
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Residual y;
    BlockCache scratch;
    const KvStep step{cache.blocks[i], cache.length};
    blocks_[i]->forward(ctx, std::move(x), 1, n, y, scratch, Recompute::None, &step);
    x = std::move(y);
  }
  cache.length += n;
  Tensor normed, last;
  Norm::Cache stats;
  Residual last_row = x.rows(n - 1, n);
  x = Residual();  // the row views keep their storage; nothing else of the prefill is needed
  final_ln_->forward_residual(ctx, std::move(last_row), last, normed, stats);
  return head_->logits(ctx, normed);
}

Tensor ModelChunk::logits(LayerContext& ctx, const Microbatch& b) {
  require_whole_model(*this, ctx, "logits");
  Tensor x;
  embedding_->forward(ctx, b.tokens, b.T, x, spec_.dtype);
  Tensor normed, sum;
  Norm::Cache stats;
  final_ln_->forward_residual(ctx, run_blocks(ctx, b, std::move(x), nullptr), sum, normed, stats);
  return head_->logits(ctx, normed);
}

}  // namespace gpt
