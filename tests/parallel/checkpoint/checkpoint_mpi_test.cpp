// Multi-rank checkpoint tests on 8 ranks. A run at (TP, PP, DP) = (2, 2, 2) with virtual pipeline 2 and
// ZeRO-1 saves at iteration 10 of 20. Resuming in the same layout reproduces steps 11..20 bit for bit;
// loading into (1, 4, 2) with ZeRO-1, (4, 1, 2) without it and (1, 1, 1) restores the iteration-10
// weights exactly (compared with an independent run's gathered weights), re-saves the identical master
// weights and Adam moments, and continues with the original run's losses within 1e-5 relative. Damage to
// one rank's file fails identically on every rank. A Llama-shaped run (grouped-query qkv with unequal
// shard blocks, untied output layer) resumes bit for bit and reshards likewise. FP8 scaling state saved
// at (2, 2, 2) loads into (4, 1, 2) and (1, 1, 1) with every scale and history as saved.
#include <mpi.h>

#include "tests/llama_variants.h"
#include "tests/parallel/checkpoint/checkpoint_test_util.h"
#include "parallel/checkpoint/checkpoint_fp8.h"
#include "parallel/comm/mpi_communicator.h"

using namespace gpt;
using namespace gpt::ckpt_test;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

struct Layout {
  int tp, pp, dp, vpp;
  bool zero1;
};

// `llama`: the model with every Llama-style variant (rope, RMSNorm, SwiGLU, 2 key/value groups for 4
// heads, so the fused qkv has unequal shard blocks, untied output layer, no biases).
Config layout_config(const Layout& l, bool llama = false) {
  Config cfg = tiny_config();
  if (llama) {
    set_llama_variant_keys(cfg, 2, 64);
  }
  cfg.parallel.tensor = l.tp;
  cfg.parallel.pipeline = l.pp;
  cfg.parallel.data = l.dp;
  cfg.parallel.virtual_pipeline = l.vpp;
  cfg.parallel.distributed_optimizer = l.zero1;
  return cfg;
}

// The parallel state of `l` over all 8 ranks, or over world rank 0 alone for (1, 1, 1).
ParallelState state_for(const Layout& l) {
  if (l.tp * l.pp * l.dp == 1) return single_process_state();
  return mpi_parallel_state(GridLayout(8, l.tp, l.pp, l.dp));
}

// A directory every rank agrees on.
std::string shared_temp_dir(const std::string& tag) {
  char buf[512] = {};
  if (world_rank() == 0) std::snprintf(buf, sizeof buf, "%s", make_temp_dir(tag).c_str());
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

// Every stored tensor of `kind`, assembled whole from a checkpoint directory.
std::map<std::string, std::vector<float>> assemble(const std::string& dir, const std::string& kind) {
  const CheckpointMeta meta = checkpoint_meta_from_yaml(read_text_file(dir + "/metadata.yaml"), dir);
  CheckpointReader reader(dir, meta);
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, shape] : meta.tensors) {
    std::vector<float> v(shape_numel(shape));
    EXPECT_EQ(reader.read(kind, name, shape, ShardSpec{}, 0, shape_numel(shape), v.data()), shape_numel(shape))
        << dir << " " << kind << " " << name;
    out[name] = std::move(v);
  }
  return out;
}

size_t real_elements(const std::string& name, size_t n, const Config& cfg) {
  const bool vocab_rows = name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
  return vocab_rows ? size_t(cfg.model.vocab_size * cfg.model.hidden_size) : n;
}

const Layout kSaved{2, 2, 2, 2, true};

// The saving run, computed once: 20 straight steps saving at 10 and 20, and the weights at iteration 10
// from a separate 10-step run.
struct Original {
  std::string dir;
  RunRecord straight;
  std::vector<std::pair<std::string, std::vector<float>>> weights10;
};

Original make_original(bool llama) {
  Original o;
  o.dir = shared_temp_dir(llama ? "mpi_llama" : "mpi");
  Config cfg = layout_config(kSaved, llama);
  cfg.checkpoint.dir = o.dir + "/saved";
  cfg.checkpoint.save_interval = 10;
  ParallelState ps = state_for(kSaved);
  o.straight = train_run(cfg, ps);
  Config ten = layout_config(kSaved, llama);
  ten.training.train_iters = 10;
  o.weights10 = train_run(ten, ps, true).weights;
  return o;
}

const Original& original(bool llama = false) {
  static Original gpt = make_original(false);
  if (!llama) return gpt;
  static Original llama_run = make_original(true);
  return llama_run;
}

// Loads iteration 10 into `target`, checks the weights and (re-saving at once) the optimizer state, then
// trains to iteration 14 and returns the losses of steps 11..14.
std::vector<double> load_check_and_continue(const Layout& target, const std::string& tag, bool llama) {
  const Original& o = original(llama);
  Config cfg = layout_config(target, llama);
  cfg.checkpoint.load = o.dir + "/saved/iter_0000010";
  cfg.checkpoint.dir = o.dir + "/resaved_" + tag;
  cfg.training.train_iters = 14;
  ParallelState ps = state_for(target);
  auto be = make_backend("cpu");
  Trainer t(cfg, ps, *be);
  EXPECT_TRUE(t.resume());
  EXPECT_EQ(t.iteration(), 10);
  EXPECT_EQ(t.consumed_samples(), 10 * cfg.training.global_batch_size);
  EXPECT_EQ(t.optimizer().adam().steps_taken(), 10);

  const auto w = t.gather_global_params();
  EXPECT_EQ(w.size(), o.weights10.size());
  for (size_t k = 0; k < w.size() && k < o.weights10.size(); ++k) {
    EXPECT_EQ(w[k].first, o.weights10[k].first);
    const size_t n = real_elements(w[k].first, w[k].second.size(), cfg);
    size_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += w[k].second[i] != o.weights10[k].second[i];
    EXPECT_EQ(differ, 0u) << tag << " " << w[k].first;
  }

  t.save_checkpoint();
  if (ps.rank == 0) {
    for (const char* kind : {"model", "adam_m", "adam_v"}) {
      auto a = assemble(o.dir + "/saved/iter_0000010", kind);
      auto b = assemble(cfg.checkpoint.dir + "/iter_0000010", kind);
      EXPECT_EQ(a.size(), b.size());
      for (auto& [name, va] : a) {
        const auto& vb = b[name];
        const size_t n = real_elements(name, va.size(), cfg);
        EXPECT_GE(vb.size(), n) << name;
        if (vb.size() < n) continue;
        size_t differ = 0;
        for (size_t i = 0; i < n; ++i) differ += va[i] != vb[i];
        EXPECT_EQ(differ, 0u) << tag << " " << kind << " " << name;
      }
    }
  }
  std::vector<double> losses;
  for (const StepStats& s : t.train()) losses.push_back(s.loss);
  return losses;
}

void expect_continues(const Layout& target, const std::string& tag, bool llama = false) {
  const Original& o = original(llama);
  std::vector<double> losses;
  if (target.tp * target.pp * target.dp > 1 || world_rank() == 0) losses = load_check_and_continue(target, tag, llama);
  MPI_Barrier(MPI_COMM_WORLD);
  if (target.tp * target.pp * target.dp == 1 && world_rank() != 0) return;
  ASSERT_EQ(losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const double ref = o.straight.losses[10 + i];
    EXPECT_NEAR(losses[i], ref, 1e-5 * std::abs(ref)) << tag << " step " << 11 + i;
  }
}

}  // namespace

void expect_resume_bit_identical(bool llama) {
  const Original& o = original(llama);
  ASSERT_EQ(o.straight.losses.size(), 20u);
  Config cfg = layout_config(kSaved, llama);
  cfg.checkpoint.load = o.dir + "/saved/iter_0000010";
  ParallelState ps = state_for(kSaved);
  RunRecord r = train_run(cfg, ps);
  ASSERT_EQ(r.losses.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(r.losses[i], o.straight.losses[10 + i]) << "step " << 11 + i;
}

TEST(CheckpointMpi, ResumeInTheSameLayoutIsBitIdentical) { expect_resume_bit_identical(false); }
TEST(CheckpointMpi, LlamaResumeInTheSameLayoutIsBitIdentical) { expect_resume_bit_identical(true); }
// Grouped-query qkv shards (q : k : v = 2 : 1 : 1 per rank at tp 2) regathered at tp 1.
TEST(CheckpointMpi, LlamaReshardsIntoPipeline4Data2Zero1) {
  expect_continues({1, 4, 2, 1, true}, "llama_tp1_pp4_dp2_zero1", true);
}
TEST(CheckpointMpi, LlamaReshardsIntoOneRank) { expect_continues({1, 1, 1, 1, false}, "llama_single", true); }

TEST(CheckpointMpi, EveryRankWroteItsShardsAndTheIndexNamesThem) {
  const Original& o = original();
  if (world_rank() != 0) return;
  const std::string dir = o.dir + "/saved/iter_0000020";
  const CheckpointMeta meta = checkpoint_meta_from_yaml(read_text_file(dir + "/metadata.yaml"), dir);
  EXPECT_EQ(meta.iteration, 20);
  EXPECT_EQ(meta.layout.tensor, 2);
  EXPECT_EQ(meta.layout.virtual_pipeline, 2);
  EXPECT_TRUE(meta.layout.distributed_optimizer);
  // With ZeRO-1 every rank owns a part of the optimizer state, so all 8 write a file.
  ASSERT_EQ(meta.files.size(), 8u);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(meta.files[r].file, rank_file_name(r));
    EXPECT_TRUE(fs::exists(dir + "/" + rank_file_name(r)));
  }
  // Each kind of each tensor is stored exactly once: the pieces' element counts add up to the tensor.
  std::map<std::pair<std::string, std::string>, int64_t> stored;
  for (const auto& f : meta.files)
    for (const auto& p : f.pieces) stored[{p.kind, p.name}] += p.end - p.begin;
  for (const auto& [name, shape] : meta.tensors)
    for (const char* kind : {"model", "adam_m", "adam_v"})
      EXPECT_EQ(stored[std::make_pair(std::string(kind), name)], shape_numel(shape)) << kind << " " << name;
  EXPECT_TRUE(fs::exists(o.dir + "/saved/iter_0000010/metadata.yaml"));
  EXPECT_EQ(read_text_file(o.dir + "/saved/latest"), "iter_0000020\n");
}

TEST(CheckpointMpi, ReshardsIntoPipeline4Data2Zero1) { expect_continues({1, 4, 2, 1, true}, "tp1_pp4_dp2_zero1"); }
TEST(CheckpointMpi, ReshardsIntoTensor4Data2) { expect_continues({4, 1, 2, 1, false}, "tp4_pp1_dp2"); }
TEST(CheckpointMpi, ReshardsIntoOneRank) { expect_continues({1, 1, 1, 1, false}, "single"); }

// One rank's file damaged: the ranks that read it fail, and every rank throws the same message.
void expect_same_error_everywhere(const std::string& damage) {
  const Original& o = original();
  const std::string dir = o.dir + "/damaged_" + damage;
  const CheckpointMeta meta =
      checkpoint_meta_from_yaml(read_text_file(o.dir + "/saved/iter_0000010/metadata.yaml"), "index");
  const StoredPiece& victim = meta.files.at(5).pieces.at(0);  // some tensor rank 5 stored
  if (world_rank() == 0) {
    copy_tree(o.dir + "/saved/iter_0000010", dir);
    const std::string file = dir + "/rank_00005.h5";
    if (damage == "missing") fs::remove(file);
    if (damage == "corrupt") flip_byte(file, dataset_offset(file, victim.dataset()) + 8);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string must_contain =
      damage == "missing" ? "is missing" : victim.name + " (" + victim.kind + "): checksum mismatch";
  Config cfg = layout_config(kSaved);
  cfg.checkpoint.load = dir;
  ParallelState ps = state_for(kSaved);
  const std::string e = resume_error(cfg, ps);
  EXPECT_TRUE(contains(e, "rank_00005.h5")) << e;
  EXPECT_TRUE(contains(e, must_contain)) << e;
  uint32_t mine[2] = {crc32_bytes(e.data(), e.size()), static_cast<uint32_t>(e.size())};
  std::vector<uint32_t> all(16);
  MPI_Allgather(mine, 2, MPI_UINT32_T, all.data(), 2, MPI_UINT32_T, MPI_COMM_WORLD);
  for (int r = 1; r < 8; ++r) {
    EXPECT_EQ(all[2 * r], all[0]) << "rank " << r << " reported a different error";
    EXPECT_EQ(all[2 * r + 1], all[1]);
  }
}

TEST(CheckpointMpi, MissingRankFileFailsAlikeOnAllRanks) { expect_same_error_everywhere("missing"); }
TEST(CheckpointMpi, CorruptedRankFileFailsAlikeOnAllRanks) { expect_same_error_everywhere("corrupt"); }

// The FP8 entries of a checkpoint: name -> stored values.
std::map<std::string, std::vector<float>> fp8_entries(const std::string& dir) {
  const CheckpointMeta meta = checkpoint_meta_from_yaml(read_text_file(dir + "/metadata.yaml"), dir);
  CheckpointReader reader(dir, meta);
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, shape] : meta.tensors) {
    if (!is_fp8_state_name(name)) continue;
    std::vector<float> v(shape_numel(shape));
    EXPECT_EQ(reader.read("fp8", name, shape, ShardSpec{}, 0, shape_numel(shape), v.data()), shape_numel(shape))
        << dir << " " << name;
    out[name] = std::move(v);
  }
  return out;
}

TEST(CheckpointMpi, Fp8ScalesReshardIntoTensor4Data2AndOneRank) {
  const std::string dir = shared_temp_dir("mpi_fp8");
  auto fp8_config = [&](const Layout& l) {
    Config cfg = layout_config(l);
    cfg.precision.fp8 = "hybrid";
    cfg.precision.fp8_amax_history_len = 4;
    return cfg;
  };
  Config saving = fp8_config(kSaved);
  saving.training.train_iters = 6;
  saving.checkpoint.dir = dir + "/saved";
  saving.checkpoint.save_interval = 6;
  {
    ParallelState ps = state_for(kSaved);
    train_run(saving, ps);
  }
  const std::string saved = dir + "/saved/iter_0000006";
  const auto stored = fp8_entries(saved);
  // 2 layers x 4 linears x 3 operands (tiny_config), each [2 + history]: scale, 4 amaxes after 6 steps.
  EXPECT_EQ(stored.size(), size_t(tiny_config().model.num_layers) * 12);
  for (const auto& [name, v] : stored) {
    ASSERT_EQ(v.size(), 6u) << name;
    EXPECT_EQ(v[1], 4.f) << name;
    EXPECT_NE(v[0], 1.f) << name;
  }
  for (const Layout& target : {Layout{4, 1, 2, 1, false}, Layout{1, 1, 1, 1, false}}) {
    const bool single = target.tp * target.pp * target.dp == 1;
    if (single && world_rank() != 0) continue;
    Config cfg = fp8_config(target);
    cfg.checkpoint.load = saved;
    cfg.checkpoint.dir = dir + "/resaved_tp" + std::to_string(target.tp);
    ParallelState ps = state_for(target);
    auto be = make_backend("cpu");
    Trainer t(cfg, ps, *be);
    ASSERT_TRUE(t.resume());
    size_t checked = 0;
    for (ModelChunk* c : t.chunks())
      for (Fp8TensorScale* sc : c->fp8_scales().all()) {
        const auto it = stored.find(sc->name);
        ASSERT_NE(it, stored.end()) << sc->name;
        EXPECT_EQ(sc->scale, it->second[0]) << sc->name;
        EXPECT_EQ(sc->history, std::vector<float>(it->second.begin() + 2, it->second.end())) << sc->name;
        ++checked;
      }
    EXPECT_EQ(checked, stored.size());  // pipeline 1: every layer on every rank
    t.save_checkpoint();
    if (ps.rank == 0) {
      EXPECT_EQ(fp8_entries(cfg.checkpoint.dir + "/iter_0000006"), stored) << target.tp;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST(CheckpointMpi, Cleanup) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    fs::remove_all(original().dir);
    fs::remove_all(original(true).dir);
  }
}
