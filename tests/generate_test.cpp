// Generation: the key/value-cached decoder against the training forward without a cache (each step's
// logits and greedy token equal the full forward's last row, fp32 and bf16, prompt in one pass or token
// by token), the token sampler (greedy, top-k = 1 is greedy, a seed reproduces its draws, the draws follow
// softmax(logits / T) restricted to top-k / top-p), and repair_utf8 against Python's
// bytes.decode(errors="replace").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "app/sampling.h"
#include "data/tokenizer.h"
#include "model/communicator.h"
#include "model/gpt_model.h"
#include "model/ops/backend.h"
#include "tests/llama_variants.h"

using namespace gpt;

namespace {

// `llama`: rotary positions (the cache holds rotated keys; new queries rotate by their own position),
// RMSNorm, SwiGLU, two key/value groups for four heads, untied, no biases.
ModelSpec decoder_spec(DType dtype, bool llama = false) {
  ModelSpec s;
  s.num_layers = 3;
  s.hidden = 32;
  s.heads = 4;
  s.ffn = 64;
  s.seq_length = 40;
  s.vocab_size = 29;
  s.vocab_divisible_by = 32;  // 32 rows
  s.init_std = 0.2f;  // large enough that the logits differ clearly between tokens
  s.dtype = dtype;
  if (llama) {
    static_cast<ModelDescription&>(s) = with_llama_variants(s, 2);
    s.rotary_base = 1000;
  }
  return s;
}

struct Decoder {
  std::unique_ptr<Backend> be = make_backend("cpu");
  SelfCommunicator tp{"tp"};
  ModelSpec spec;
  ModelChunk chunk;
  explicit Decoder(DType dtype, bool llama = false)
      : spec(decoder_spec(dtype, llama)), chunk(spec, 0, spec.num_layers, true, true) {
    chunk.allocate_and_init(*be, 11);
  }
  Tensor ids(const std::vector<int32_t>& v) {
    Tensor t = be->empty({static_cast<int64_t>(v.size())}, DType::I32);
    be->upload_i32(v.data(), t);
    return t;
  }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> v(t.numel());
    be->download(t, v.data());
    return v;
  }
  // Logits of the last position of `context` by the training forward (no cache).
  std::vector<float> full_forward_last(const std::vector<int32_t>& context) {
    LayerContext ctx{*be, tp};
    Microbatch b;
    b.B = 1;
    b.T = static_cast<int64_t>(context.size());
    b.tokens = ids(context);
    std::vector<float> all = host(chunk.logits(ctx, b));
    return std::vector<float>(all.end() - spec.padded_vocab(), all.end());
  }
};

std::span<const float> real_vocab(const std::vector<float>& logits, int64_t vocab) {
  return std::span<const float>(logits.data(), static_cast<size_t>(vocab));
}

// Greedy decoding with the cache, `prompt` in one pass (or token by token), checking every step's logits
// against the full forward of the whole context.
void check_cache_against_full_forward(DType dtype, bool prompt_in_one_pass, float tol, bool llama = false) {
  Decoder d(dtype, llama);
  LayerContext ctx{*d.be, d.tp};
  std::vector<int32_t> context = {28, 3, 17, 5, 9};
  ModelChunk::KvCache cache = d.chunk.make_kv_cache(*d.be, d.spec.seq_length);
  std::vector<float> cached;
  if (prompt_in_one_pass) {
    cached = d.host(d.chunk.decode(ctx, d.ids(context), cache));
  } else {
    for (int32_t t : context) cached = d.host(d.chunk.decode(ctx, d.ids({t}), cache));
  }
  int checked_argmax = 0;
  while (static_cast<int64_t>(context.size()) < d.spec.seq_length) {
    const std::vector<float> full = d.full_forward_last(context);
    ASSERT_EQ(cached.size(), full.size());
    float scale = 0, err = 0;
    for (size_t i = 0; i < full.size(); ++i) {
      scale = std::max(scale, std::fabs(full[i]));
      err = std::max(err, std::fabs(full[i] - cached[i]));
    }
    ASSERT_LE(err, tol * std::max(scale, 1.f)) << "position " << context.size();
    const int32_t next = argmax_token(real_vocab(cached, d.spec.vocab_size));
    // The greedy token equals the full forward's argmax unless two logits are closer than the tolerance.
    std::vector<float> sorted(full.begin(), full.begin() + d.spec.vocab_size);
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] > 2 * tol * std::max(scale, 1.f)) {
      EXPECT_EQ(next, argmax_token(real_vocab(full, d.spec.vocab_size))) << "position " << context.size();
      ++checked_argmax;
    }
    context.push_back(next);
    if (static_cast<int64_t>(context.size()) == d.spec.seq_length) break;
    cached = d.host(d.chunk.decode(ctx, d.ids({next}), cache));
  }
  EXPECT_EQ(cache.length, d.spec.seq_length - 1);
  EXPECT_GT(checked_argmax, 20);
}

}  // namespace

TEST(KvCacheDecode, MatchesFullForwardFp32) { check_cache_against_full_forward(DType::F32, true, 2e-5f); }
TEST(KvCacheDecode, MatchesFullForwardFp32TokenByToken) { check_cache_against_full_forward(DType::F32, false, 2e-5f); }
// bf16: the cached and full paths round the same activations at different row counts of the products,
// so they agree to bf16's precision.
TEST(KvCacheDecode, MatchesFullForwardBf16) { check_cache_against_full_forward(DType::BF16, true, 3e-2f); }
TEST(KvCacheDecode, LlamaVariantsMatchFullForward) {
  check_cache_against_full_forward(DType::F32, true, 2e-5f, true);
  check_cache_against_full_forward(DType::F32, false, 2e-5f, true);
}

TEST(KvCacheDecode, RejectsOverflowAndBadCapacity) {
  Decoder d(DType::F32);
  LayerContext ctx{*d.be, d.tp};
  EXPECT_THROW(d.chunk.make_kv_cache(*d.be, d.spec.seq_length + 1), std::invalid_argument);
  EXPECT_THROW(d.chunk.make_kv_cache(*d.be, 0), std::invalid_argument);
  ModelChunk::KvCache cache = d.chunk.make_kv_cache(*d.be, 4);
  d.chunk.decode(ctx, d.ids({1, 2, 3}), cache);
  EXPECT_THROW(d.chunk.decode(ctx, d.ids({4, 5}), cache), std::invalid_argument);
  EXPECT_NO_THROW(d.chunk.decode(ctx, d.ids({4}), cache));
  EXPECT_THROW(d.chunk.decode(ctx, d.ids({6}), cache), std::invalid_argument);
}

TEST(KvCacheDecode, NeedsTheWholeModel) {
  auto be = make_backend("cpu");
  SelfCommunicator tp{"tp"};
  ModelSpec s = decoder_spec(DType::F32);
  ModelChunk first(s, 0, 1, true, false);
  first.allocate_and_init(*be, 1);
  LayerContext ctx{*be, tp};
  ModelChunk::KvCache cache = first.make_kv_cache(*be, 4);
  Tensor ids = be->empty({1}, DType::I32);
  int32_t one = 1;
  be->upload_i32(&one, ids);
  EXPECT_THROW(first.decode(ctx, ids, cache), std::logic_error);
}

// ---- sampling ----

namespace {
std::vector<float> random_logits(std::mt19937& rng, int n) {
  std::normal_distribution<float> g(0.f, 2.f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}
}  // namespace

TEST(Sampling, TemperatureZeroIsGreedyAndDeterministic) {
  std::mt19937 init(5);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l = random_logits(init, 37);
    std::mt19937_64 a(i), b(i + 1000);
    const int32_t want = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    EXPECT_EQ(sample_token(l, {0.0, 0, 1.0}, a), want);
    EXPECT_EQ(sample_token(l, {0.0, 5, 0.5}, b), want);
  }
}

TEST(Sampling, TopKOneIsGreedy) {
  std::mt19937 init(6);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l = random_logits(init, 37);
    std::mt19937_64 a(i);
    EXPECT_EQ(sample_token(l, {1.7, 1, 1.0}, a), argmax_token(l));
  }
}

TEST(Sampling, SameSeedSameSamplesOtherSeedOtherSamples) {
  std::mt19937 init(7);
  std::vector<float> l = random_logits(init, 50);
  auto draw = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sample_token(l, {1.0, 20, 0.95}, rng));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

// Frequencies of many draws against softmax(logits / T) renormalised over the kept tokens.
TEST(Sampling, DrawsFollowTheFilteredSoftmax) {
  const std::vector<float> l = {2.0f, 1.0f, 0.5f, -1.0f, 0.0f, 1.5f};
  struct Case {
    SamplingOptions o;
    std::vector<int> kept;  // token indices that may be drawn
  };
  // Probabilities at T = 1: 0.391 0.144 0.087 0.019 0.053 0.237 (descending: 0 5 1 2 4 3).
  const std::vector<Case> cases = {
      {{1.0, 0, 1.0}, {0, 1, 2, 3, 4, 5}},
      {{0.7, 0, 1.0}, {0, 1, 2, 3, 4, 5}},
      {{1.0, 3, 1.0}, {0, 5, 1}},
      {{1.0, 0, 0.7}, {0, 5, 1}},   // 0.391 + 0.237 = 0.628 < 0.7 <= 0.772
      {{1.0, 2, 0.99}, {0, 5}},
  };
  for (const Case& c : cases) {
    std::vector<double> p(l.size(), 0.0);
    double sum = 0;
    for (int k : c.kept) sum += p[k] = std::exp(l[k] / c.o.temperature);
    for (double& x : p) x /= sum;
    std::mt19937_64 rng(99);
    const int n = 40000;
    std::vector<int> count(l.size(), 0);
    for (int i = 0; i < n; ++i) ++count[sample_token(l, c.o, rng)];
    for (size_t k = 0; k < l.size(); ++k) {
      const double f = double(count[k]) / n, sd = std::sqrt(p[k] * (1 - p[k]) / n);
      EXPECT_NEAR(f, p[k], 5 * sd + 1e-9) << "token " << k << " T=" << c.o.temperature << " k=" << c.o.top_k
                                           << " p=" << c.o.top_p;
    }
  }
}

TEST(Sampling, NonFiniteLogitsAreNeverDrawn) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> l = {NAN, 1.0f, -inf, 0.5f, inf};
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = sample_token(l, {1.0, 0, 1.0}, rng);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  EXPECT_EQ(argmax_token(l), 1);
  std::vector<float> none = {NAN, inf};
  EXPECT_THROW(argmax_token(none), std::runtime_error);
}

TEST(Sampling, RejectsBadOptions) {
  EXPECT_THROW(check_sampling_options({-0.1, 0, 1.0}), std::invalid_argument);
  EXPECT_THROW(check_sampling_options({NAN, 0, 1.0}), std::invalid_argument);
  EXPECT_THROW(check_sampling_options({1.0, -1, 1.0}), std::invalid_argument);
  EXPECT_THROW(check_sampling_options({1.0, 0, 0.0}), std::invalid_argument);
  EXPECT_THROW(check_sampling_options({1.0, 0, 1.5}), std::invalid_argument);
  EXPECT_NO_THROW(check_sampling_options({0.0, 0, 1.0}));
}

// ---- decoding bytes to text ----

TEST(RepairUtf8, MatchesPythonReplace) {
  const std::string R = "\xEF\xBF\xBD";
  // Expected values from Python 3: bytes.decode("utf-8", "replace").encode().
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ok", "ok"},
      {"\x80", R},
      {"a\xC3", "a" + R},
      {"\xC3\xA9", "\xC3\xA9"},
      {"\xE2\x82", R},
      {"\xE2\x82\xAC", "\xE2\x82\xAC"},
      {"\xED\xA0\x80", R + R + R},
      {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80"},
      {"\xF4\x90\x80\x80", R + R + R + R},
      {"\xC0\xAF", R + R},
      {"\xE0\x80\xAF", R + R + R},
      {"\xF0\x9F\x98", R},
      {"\xFF\xFE" "A", R + R + "A"},
      {"\xE2(\xA1", R + "(" + R},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(repair_utf8(in), want) << "input of " << in.size() << " bytes";
}
