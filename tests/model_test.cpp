// Whole-model checks on one process: every parameter's gradient against central finite differences of
// the loss, the loss and all gradients against PyTorch (float64 reference run by tests/torch_reference.py
// on weights this test writes), and memorization of a repeating token pattern by the full training loop.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>

#include "app/trainer.h"
#include "model/gpt_model.h"
#include "model/ops/backend.h"
#include "tests/tiny_model_config.h"

namespace fs = std::filesystem;
using namespace gpt;

namespace {

ModelSpec tiny_spec() {
  ModelSpec s;
  s.num_layers = 2;
  s.hidden = 8;
  s.heads = 2;
  s.ffn = 16;
  s.seq_length = 5;
  s.vocab_size = 11;
  s.vocab_divisible_by = 16;  // 16 rows
  s.init_std = 0.3f;  // large enough that every path of the graph carries real gradient
  return s;
}

// The same size with every Llama-style variant: rotary positions, RMSNorm, SwiGLU, two query groups for
// four heads, an untied output layer and no biases on the linears.
ModelSpec tiny_llama_spec() {
  ModelSpec s = tiny_spec();
  s.hidden = 16;
  s.heads = 4;
  s.num_query_groups = 2;
  s.ffn = 12;
  s.position = PositionEmbedding::Rope;
  s.rotary_base = 500;  // angles that differ clearly over 5 positions
  s.normalization = Normalization::RMSNorm;
  s.swiglu = true;
  s.untie_embeddings = true;
  s.add_bias_linear = false;
  return s;
}

struct TinyModel {
  std::unique_ptr<Backend> be = make_backend("cpu");
  SelfCommunicator tp{"tp"};
  ModelSpec spec;
  ModelChunk chunk;
  Microbatch batch;
  std::vector<int32_t> tokens;  // [B, T+1]

  explicit TinyModel(int64_t B = 3, uint64_t seed = 7, const ModelSpec& model = tiny_spec())
      : spec(model), chunk(spec, 0, spec.num_layers, true, true) {
    chunk.allocate_and_init(*be, seed);
    std::mt19937 rng(seed);
    tokens.resize(B * (spec.seq_length + 1));
    for (auto& t : tokens) t = int32_t(rng() % spec.vocab_size);
    std::vector<int32_t> in(B * spec.seq_length), tg(B * spec.seq_length);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < spec.seq_length; ++t) {
        in[b * spec.seq_length + t] = tokens[b * (spec.seq_length + 1) + t];
        tg[b * spec.seq_length + t] = tokens[b * (spec.seq_length + 1) + t + 1];
      }
    batch.B = B;
    batch.T = spec.seq_length;
    batch.tokens = be->empty({B * spec.seq_length}, DType::I32);
    batch.targets = be->empty({B * spec.seq_length}, DType::I32);
    be->upload_i32(in.data(), batch.tokens);
    be->upload_i32(tg.data(), batch.targets);
  }
  // Mean token loss; with grads=true also fills every parameter's gradient of that mean.
  double loss(bool grads) {
    LayerContext ctx{*be, tp};
    Tensor loss_sum = be->zeros({1}, DType::F64);
    double l = 0;
    if (!grads) {
      chunk.eval_forward(ctx, batch, Tensor(), &loss_sum);
      be->download_f64(loss_sum, &l);
      return l;
    }
    chunk.params().zero_grad(*be);
    chunk.forward(ctx, 0, batch, Tensor(), 1.0f / float(batch.B * batch.T), &loss_sum);
    chunk.backward(ctx, 0, batch, Tensor());
    chunk.reduce_tied_gradient_locally(*be);
    be->download_f64(loss_sum, &l);
    return l;
  }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> v(t.numel());
    be->download(t, v.data());
    return v;
  }
};

double rel_err(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

void expect_gradients_match_finite_differences(const ModelSpec& spec) {
  TinyModel m(3, 7, spec);
  m.loss(true);
  std::mt19937 rng(3);
  for (auto& p : m.chunk.params().params()) {
    std::vector<float> w = m.host(p->value), g = m.host(p->grad);
    // Up to 24 elements per tensor (all of small ones); padding rows of the vocabulary have no gradient.
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < (int64_t)w.size(); ++i) idx.push_back(i);
    std::shuffle(idx.begin(), idx.end(), rng);
    if (idx.size() > 24) idx.resize(24);
    std::vector<double> analytic, numeric;
    const float h = 1e-2f;
    for (int64_t i : idx) {
      std::vector<float> wp = w;
      wp[i] = w[i] + h;
      m.be->upload(wp.data(), p->value);
      double lp = m.loss(false);
      wp[i] = w[i] - h;
      m.be->upload(wp.data(), p->value);
      double lm = m.loss(false);
      m.be->upload(w.data(), p->value);
      numeric.push_back((lp - lm) / (2.0 * h));
      analytic.push_back(g[i]);
    }
    double norm = 0;
    for (double a : numeric) norm += a * a;
    if (norm < 1e-14) continue;  // e.g. padding rows only
    EXPECT_LT(rel_err(analytic, numeric), 2e-2) << p->name;
  }
}

TEST(ModelGradients, MatchFiniteDifferences) { expect_gradients_match_finite_differences(tiny_spec()); }
TEST(ModelGradients, LlamaVariantsMatchFiniteDifferences) { expect_gradients_match_finite_differences(tiny_llama_spec()); }

#ifndef GPT_SOURCE_DIR
#define GPT_SOURCE_DIR "."
#endif

void expect_gradients_match_pytorch(const ModelSpec& spec, const std::string& tag) {
  TinyModel m(4, 11, spec);
  double loss = m.loss(true);
  fs::path dir = fs::temp_directory_path() / ("gpt_torch_ref_" + tag + "_" + std::to_string(::getpid()));
  fs::create_directories(dir / "in");
  std::ostringstream man;
  man << "{\"config\": {\"num_layers\": " << m.spec.num_layers << ", \"hidden_size\": " << m.spec.hidden
      << ", \"num_heads\": " << m.spec.heads << ", \"ffn_hidden_size\": " << m.spec.ffn
      << ", \"seq_length\": " << m.spec.seq_length << ", \"vocab_size\": " << m.spec.vocab_size
      << ", \"padded_vocab_size\": " << m.spec.padded_vocab() << ", \"layernorm_eps\": " << m.spec.eps
      << ", \"position_embedding_type\": \"" << position_embedding_name(m.spec.position)
      << "\", \"rotary_base\": " << m.spec.rotary_base << ", \"rotary_percent\": " << m.spec.rotary_percent
      << ", \"normalization\": \"" << normalization_name(m.spec.normalization)
      << "\", \"swiglu\": " << (m.spec.swiglu ? "true" : "false")
      << ", \"num_query_groups\": " << m.spec.num_query_groups
      << ", \"untie_embeddings_and_output_weights\": " << (m.spec.untie_embeddings ? "true" : "false")
      << ", \"add_bias_linear\": " << (m.spec.add_bias_linear ? "true" : "false") << "}, \"tensors\": [";
  bool first = true;
  for (auto& p : m.chunk.params().params()) {
    auto w = m.host(p->value);
    std::ofstream(dir / "in" / (p->name + ".bin"), std::ios::binary)
        .write(reinterpret_cast<const char*>(w.data()), w.size() * 4);
    man << (first ? "" : ", ") << "{\"name\": \"" << p->name << "\", \"shape\": [";
    for (size_t d = 0; d < p->global_shape.size(); ++d) man << (d ? ", " : "") << p->global_shape[d];
    man << "], \"file\": \"" << p->name << ".bin\"}";
    first = false;
  }
  man << "]}";
  std::ofstream(dir / "in" / "manifest.json") << man.str();
  std::ofstream(dir / "in" / "tokens.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(m.tokens.data()), m.tokens.size() * 4);
  std::string cmd = std::string("/usr/bin/python3 ") + GPT_SOURCE_DIR + "/tests/torch_reference.py " +
                    (dir / "in").string() + " " + (dir / "out").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  std::ifstream lf(dir / "out" / "loss.json");
  std::string text((std::istreambuf_iterator<char>(lf)), {});
  std::smatch match;
  ASSERT_TRUE(std::regex_search(text, match, std::regex("\"loss\":\\s*([-0-9.eE+]+)"))) << text;
  double ref_loss = std::stod(match[1]);
  EXPECT_LE(std::abs(loss - ref_loss) / std::abs(ref_loss), 1e-5) << loss << " vs " << ref_loss;

  for (auto& p : m.chunk.params().params()) {
    auto g = m.host(p->grad);
    std::vector<double> ref(g.size()), ours(g.begin(), g.end());
    std::ifstream(dir / "out" / (p->name + ".bin"), std::ios::binary)
        .read(reinterpret_cast<char*>(ref.data()), ref.size() * 8);
    EXPECT_LE(rel_err(ours, ref), 1e-5) << p->name;
  }
  fs::remove_all(dir);
}

bool have_torch() {
  return fs::exists("/usr/bin/python3") && std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") == 0;
}

TEST(ModelGradients, MatchPyTorch) {
  if (!have_torch()) GTEST_SKIP() << "python3-torch not installed";
  expect_gradients_match_pytorch(tiny_spec(), "gpt");
}

// Loss and every gradient of the Llama-shaped model against the PyTorch float64 reference, within 1e-5.
TEST(ModelGradients, LlamaVariantsMatchPyTorch) {
  if (!have_torch()) GTEST_SKIP() << "python3-torch not installed";
  expect_gradients_match_pytorch(tiny_llama_spec(), "llama");
  ModelSpec partial = tiny_llama_spec();  // half of each head rotates; LayerNorm with biases, tied
  partial.hidden = 32;
  partial.rotary_percent = 0.5;
  partial.normalization = Normalization::LayerNorm;
  partial.add_bias_linear = true;
  partial.untie_embeddings = false;
  expect_gradients_match_pytorch(partial, "partial_rope");
}

TEST(Training, MemorizesRepeatingPattern) {
  Config cfg = tiny_model_config();
  cfg.training.train_iters = 150;
  cfg.optimizer.lr = 3e-3;
  cfg.optimizer.min_lr = 3e-4;
  cfg.optimizer.warmup_iters = 10;
  cfg.optimizer.weight_decay = 0.0;
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  Trainer trainer(cfg, ps, *be);
  auto stats = trainer.train();
  ASSERT_EQ(stats.size(), 150u);
  EXPECT_GT(stats.front().loss, 2.0);
  EXPECT_LT(stats.back().loss, 0.1);
}
