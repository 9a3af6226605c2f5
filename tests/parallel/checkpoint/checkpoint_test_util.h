// Helpers shared by the checkpoint tests (tests/parallel/checkpoint/checkpoint_test.cpp, tests/parallel/checkpoint/checkpoint_mpi_test.cpp): a
// tiny model config whose layer count allows pipeline 4 x virtual 2, temporary directories, runs that
// record every step, and small file surgery for the damage tests.
#pragma once
#include <gtest/gtest.h>
#include <hdf5.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/trainer.h"
#include "parallel/checkpoint/checkpoint.h"

namespace gpt::ckpt_test {

namespace fs = std::filesystem;

inline Config tiny_config() {
  Config cfg;
  cfg.model.num_layers = 8;  // divisible by pipeline 4 x virtual 2, and by 2 x 2
  cfg.model.hidden_size = 32;
  cfg.model.num_heads = 4;
  cfg.model.seq_length = 16;
  cfg.model.vocab_size = 100;  // padded to 128 x tp: tp changes the padded rows
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = 16;
  cfg.training.train_iters = 20;
  cfg.optimizer.lr = 2e-3;
  cfg.optimizer.min_lr = 2e-4;
  cfg.optimizer.warmup_iters = 3;
  cfg.optimizer.decay_iters = 20;  // the LR schedule must not depend on where a run stops
  cfg.optimizer.clip_grad = 1.0;
  cfg.logging.interval = 1000;
  cfg.checkpoint.keep_last = 0;
  return cfg;
}

// Two layers are enough on one process (the 8-layer tiny config is for pipeline 4 x virtual 2).
inline Config small_config() {
  Config cfg = tiny_config();
  cfg.model.num_layers = 2;
  return cfg;
}

inline std::string make_temp_dir(const std::string& tag) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/gpt_ckpt_" + tag + "_XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + templ);
  return buf.data();
}

// A temporary directory removed with everything in it when the test leaves its scope, passed or not.
struct TempDir {
  explicit TempDir(const std::string& tag) : path(make_temp_dir(tag)) {}
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string path;
};

struct RunRecord {
  std::vector<double> losses, scales;
  int64_t skipped = 0;  // steps whose gradients overflowed (fp16)
  std::vector<std::pair<std::string, std::vector<float>>> weights;
};

// Trains `cfg` (resuming as the config says) and records each step; weights are gathered at the end.
inline RunRecord train_run(const Config& cfg, ParallelState& ps, bool gather = false) {
  auto be = make_backend("cpu");
  Trainer t(cfg, ps, *be);
  RunRecord r;
  for (const StepStats& s : t.train()) {
    r.losses.push_back(s.loss);
    r.scales.push_back(s.loss_scale);
    r.skipped += s.skipped;
  }
  if (gather) r.weights = t.gather_global_params();
  return r;
}

// The message of the CheckpointError that loading `cfg`'s checkpoint throws ("" when it loads).
inline std::string resume_error(const Config& cfg, ParallelState& ps) {
  auto be = make_backend("cpu");
  Trainer t(cfg, ps, *be);
  try {
    t.resume();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

inline void copy_tree(const std::string& from, const std::string& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

// File offset of a contiguous dataset's raw data.
inline int64_t dataset_offset(const std::string& file, const std::string& dataset) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  if (off == HADDR_UNDEF) throw std::runtime_error("no offset for " + dataset + " in " + file);
  return static_cast<int64_t>(off);
}

inline void flip_byte(const std::string& file, int64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(offset);
  f.write(&c, 1);
}

// ---- convert: a trained model against its converted copy ----

// Our loss on the first global batch of the validation stream of trained run `t`, whose tokens go to
// `file` as int32 rows of seq_length + 1, for a reference reading the converted weights to score.
inline double score_first_valid_batch(Trainer& t, const Config& cfg, const std::string& file) {
  auto source = t.make_source("valid");
  std::vector<int32_t> tokens(cfg.training.global_batch_size * (cfg.model.seq_length + 1));
  for (int64_t i = 0; i < cfg.training.global_batch_size; ++i)
    source->sample(i, tokens.data() + i * (cfg.model.seq_length + 1));
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 4));
  return t.evaluate(*source, 1);
}

// A fresh run of `cfg` loading the imported checkpoint `dir` holds exactly `weights` (of the embedding and
// output layer, the real vocabulary rows: an import has no padding) and scores `loss` on that batch.
inline void expect_imported(const Config& cfg, const std::string& dir,
                            const std::vector<std::pair<std::string, std::vector<float>>>& weights, double loss) {
  ParallelState ps = single_process_state();
  auto be = make_backend("cpu");
  Config load = cfg;
  load.checkpoint.dir.clear();
  load.checkpoint.load = dir;
  Trainer fresh(load, ps, *be);
  ASSERT_TRUE(fresh.resume());
  EXPECT_EQ(fresh.iteration(), 0);
  const auto back = fresh.gather_global_params();
  ASSERT_EQ(back.size(), weights.size());
  const size_t vocab_values = size_t(cfg.model.vocab_size * cfg.model.hidden_size);
  for (size_t k = 0; k < weights.size(); ++k) {
    const std::string& name = weights[k].first;
    ASSERT_EQ(back[k].first, name);
    const bool vocab = name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
    const size_t n = vocab ? vocab_values : weights[k].second.size();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[k].second[i], weights[k].second[i]) << name << " " << i;
  }
  EXPECT_NEAR(fresh.evaluate(*fresh.make_source("valid"), 1), loss, 1e-6 * loss);
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace gpt::ckpt_test
