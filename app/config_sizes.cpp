// Overflow-checked arithmetic on the sizes derived from a config (see app/config_sizes.h). Each derived
// value carries the keys it was computed from, so an overflow is reported with those keys and values.
// The bounds mirror what the program computes in 64-bit integers: model/param_count.h's formula itself,
// evaluated in long double (parameters),
// parallel/plan/memory_model.cpp (bytes; its activations are bounded here by every sample of the global
// batch being in flight at once: no schedule exceeds that, and the planner prices micro_batch_size up to
// the global batch on one stage), the batch loader and the schedule (`int`).
#include "app/config_sizes.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <string>
#include <vector>

#include "app/config.h"
#include "app/config_model.h"
#include "model/param_count.h"

namespace gpt {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// A value computed from config keys and the keys ("model.hidden_size = 64") it was made of.
struct Size {
  int64_t value = 0;
  std::vector<std::string> keys;
};

class SizeChecker {
 public:
  explicit SizeChecker(const Config& c) : c_(c) {}

  // A key's value; `value` may differ from the one shown (parallel.data 0 counts as 1).
  static Size key(const char* path, int64_t shown, int64_t value) {
    return {value, {fmt::format("{} = {}", path, shown)}};
  }
  static Size key(const char* path, int64_t value) { return key(path, value, value); }
  static Size constant(int64_t value) { return {value, {}}; }

  // The product or sum of `terms`; `what` names the result in the error.
  Size product(const char* what, std::initializer_list<Size> terms) const {
    return fold(what, 1, terms, [](int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); });
  }
  Size sum(const char* what, std::initializer_list<Size> terms) const {
    return fold(what, 0, terms, [](int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); });
  }
  // `terms` combined from `start` by `op` (which returns true on overflow).
  template <class Op>
  Size fold(const char* what, int64_t start, std::initializer_list<Size> terms, Op op) const {
    Size r = constant(start);
    for (const Size& t : terms) {
      merge(r, t);
      if (op(r.value, t.value, &r.value)) overflow(what, r, terms);
    }
    return r;
  }

  // The parameter count of model/param_count.h's formula (the one the model allocates by), evaluated in
  // long double, each part and the whole (and its bytes: 20 per parameter, weights, gradients, fp32 master
  // weights and Adam moments) within a 64-bit integer, or an error naming the keys it was made of.
  void parameters(const Config& c, const Size& padded, const Size& h, const Size& ffn, const Size& seq,
                  const Size& layers) const {
    ModelDescription d = model_description_from_config(c);
    d.ffn = ffn.value;
    const ParamCounts<long double> n = count_parameters_in<long double>(d, static_cast<long double>(padded.value));
    Size layer = merged({h, ffn, key("model.num_heads", c.model.num_heads)});
    if (c.model.num_query_groups) merge(layer, key("model.num_query_groups", c.model.num_query_groups));
    const Size all = merged({padded, layer, seq, layers});
    bound("the word embedding (padded vocabulary x model.hidden_size)", n.word_embedding, merged({padded, h}));
    bound("the position embedding (model.seq_length x model.hidden_size)", n.position_embedding, merged({seq, h}));
    bound("the parameter count of one layer (model/param_count.h: q|k|v, projection, MLP, norms, biases)",
          n.per_layer, layer);
    bound("the parameter count (word and position embeddings, num_layers x one layer, final norm, output layer)",
          n.total(), all);
    bound("the byte size of the parameters (20 per parameter: weights, gradients, fp32 master weights and Adam "
          "moments)",
          20 * n.total(), all);
  }

  // Counts the program holds in an int.
  void key_fits_int(const char* path, int64_t value) const {
    if (value > INT_MAX)
      throw ConfigError(fmt::format("config {}: {} must be <= {}, got {}", c_.source, path, INT_MAX, value));
  }
  void fits_int(const char* what, const Size& s) const {
    if (s.value > INT_MAX)
      throw ConfigError(fmt::format("config {}: {} is {}, more than {} ({})", c_.source, what, s.value, INT_MAX,
                                    join(s.keys)));
  }

 private:
  static void merge(Size& into, const Size& from) {
    for (const std::string& k : from.keys)
      if (std::find(into.keys.begin(), into.keys.end(), k) == into.keys.end()) into.keys.push_back(k);
  }
  static Size merged(std::initializer_list<Size> parts) {
    Size r = constant(0);
    for (const Size& p : parts) merge(r, p);
    return r;
  }
  void bound(const char* what, long double value, const Size& made_of) const {
    if (value > static_cast<long double>(INT64_MAX)) overflow(what, made_of, {});
  }
  [[noreturn]] void overflow(const char* what, Size r, std::initializer_list<Size> terms) const {
    for (const Size& t : terms) merge(r, t);
    throw ConfigError(fmt::format("config {}: {} overflows a 64-bit integer ({}); reduce {}", c_.source, what,
                                  join(r.keys), r.keys.size() == 1 ? "that value" : "these values"));
  }

  const Config& c_;
};

}  // namespace

void check_derived_sizes(const Config& c) {
  const SizeChecker s(c);
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const TrainingConfig& t = c.training;
  using K = SizeChecker;

  // Held in an int: layers, parallel sizes, the world and chunk counts they make, microbatches, threads.
  s.key_fits_int("model.num_layers", m.num_layers);
  s.key_fits_int("parallel.tensor", p.tensor);
  s.key_fits_int("parallel.pipeline", p.pipeline);
  s.key_fits_int("parallel.virtual_pipeline", p.virtual_pipeline);
  s.key_fits_int("parallel.data", p.data);
  s.key_fits_int("parallel.context", p.context);
  s.key_fits_int("training.threads", t.threads);
  const Size tp = K::key("parallel.tensor", p.tensor), pp = K::key("parallel.pipeline", p.pipeline);
  const Size vpp = K::key("parallel.virtual_pipeline", p.virtual_pipeline);
  const Size dp = K::key("parallel.data", p.data, std::max<int64_t>(p.data, 1));  // 0: derived, at least 1
  const Size cp = K::key("parallel.context", p.context);
  const Size micro = K::key("training.micro_batch_size", t.micro_batch_size);
  const Size global = K::key("training.global_batch_size", t.global_batch_size);
  const char* world = "the world size (parallel.tensor x parallel.pipeline x parallel.context x parallel.data)";
  s.fits_int(world, s.product(world, {tp, pp, cp, dp}));
  const char* chunks = "the model chunk count (parallel.pipeline x parallel.virtual_pipeline)";
  s.fits_int(chunks, s.product(chunks, {pp, vpp}));
  s.product("the sample count of one data-parallel step (training.micro_batch_size x parallel.data)", {micro, dp});
  const Size microbatches{t.global_batch_size / t.micro_batch_size, {global.keys[0], micro.keys[0]}};
  s.fits_int("the microbatch count per step (training.global_batch_size / training.micro_batch_size)", microbatches);
  s.product("parallel.bucket_size_mb in bytes",
            {K::key("parallel.bucket_size_mb", p.bucket_size_mb), K::constant(1 << 20)});

  // The model: padded vocabulary, MLP width, parameters and their bytes (model/param_count.cpp).
  const Size vocab_multiple =
      s.product("the vocabulary padding multiple (model.make_vocab_size_divisible_by x parallel.tensor)",
                {K::key("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by), tp});
  Size padded = s.sum("the padded vocabulary (model.vocab_size rounded up to a multiple of "
                      "model.make_vocab_size_divisible_by x parallel.tensor)",
                      {K::key("model.vocab_size", m.vocab_size), Size{vocab_multiple.value - 1, vocab_multiple.keys}});
  padded.value = padded.value / vocab_multiple.value * vocab_multiple.value;
  const Size h = K::key("model.hidden_size", m.hidden_size);
  const Size ffn = m.ffn_hidden_size
                       ? K::key("model.ffn_hidden_size", m.ffn_hidden_size)
                       : s.product("model.ffn_hidden_size's default (4 x model.hidden_size)", {K::constant(4), h});
  const Size seq = K::key("model.seq_length", m.seq_length);
  const Size layers = K::key("model.num_layers", m.num_layers);
  s.parameters(c, padded, h, ffn, seq, layers);

  // Activations: per sample and layer, the [T, 16 h + 4 ffn] tensors a block keeps or makes and its
  // attention statistics [heads, T]; the LM head's [T, padded vocab] logits; 4 bytes each.
  const char* act = "a bound on a step's activation bytes (4 x global_batch_size x (num_layers x (seq_length x "
                    "(16 hidden + 4 ffn) + num_heads x seq_length) + seq_length x padded vocabulary))";
  const Size per_token = s.sum(act, {s.product(act, {K::constant(16), h}), s.product(act, {K::constant(4), ffn})});
  const Size per_sample_layer = s.sum(
      act, {s.product(act, {seq, per_token}), s.product(act, {K::key("model.num_heads", m.num_heads), seq})});
  const Size per_sample =
      s.sum(act, {s.product(act, {layers, per_sample_layer}), s.product(act, {seq, padded})});
  s.product(act, {K::constant(4), global, per_sample});

  // Data: the tokens of the whole run and of one evaluation.
  s.product("the token count of the run (training.train_iters x training.global_batch_size x model.seq_length)",
            {K::key("training.train_iters", t.train_iters), global, seq});
  s.product("the token count of one evaluation (eval.iters x training.global_batch_size x model.seq_length)",
            {K::key("eval.iters", c.eval.iters), global, seq});
}

}  // namespace gpt
