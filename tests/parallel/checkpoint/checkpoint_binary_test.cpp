// Checkpoints through the gpt-train binary: a real run killed with SIGKILL in the middle of a save and
// resumed; `eval --load`; and `convert` export/import, with the exported safetensors file read by an
// independent NumPy GPT-2 (Hugging Face layout) that must reproduce our loss.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include "app/convert.h"
#include "tests/parallel/checkpoint/checkpoint_test_util.h"
#include "tests/gpt_train_process.h"

using namespace gpt;
using namespace gpt::ckpt_test;

namespace {

TEST(CheckpointCrash, SigkillDuringSaveLeavesThePreviousCheckpointLoadable) {
  const TempDir tmp("crash");
  const std::string& dir = tmp.path;
  // Large enough that a save (values + Adam moments, ~60 MB) takes a while, small enough to step quickly.
  Config cfg = tiny_config();
  cfg.model.num_layers = 2;
  cfg.model.hidden_size = 512;
  cfg.model.num_heads = 8;
  cfg.model.seq_length = 32;
  cfg.model.vocab_size = 256;
  cfg.training.micro_batch_size = 1;
  cfg.training.global_batch_size = 1;
  cfg.training.train_iters = 1000;
  cfg.checkpoint.dir = dir + "/c";
  cfg.checkpoint.save_interval = 1;
  cfg.checkpoint.keep_last = 2;
  cfg.logging.interval = 1;
  cfg.logging.metrics_file = dir + "/metrics.jsonl";
  write_text(dir + "/cfg.yaml", dump_config(cfg));

  pid_t pid = spawn_gpt_train({"train", "--config", dir + "/cfg.yaml"}, dir + "/train.log");
  // Wait for a complete checkpoint, then for the next save's rank file to appear, and kill.
  bool killed_mid_save = false;
  std::string staging;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && !killed_mid_save) {
    if (fs::exists(cfg.checkpoint.dir + "/latest")) {
      for (const auto& e : fs::directory_iterator(cfg.checkpoint.dir)) {
        const std::string name = e.path().filename().string();
        if (name.ends_with(".tmp") && fs::exists(e.path() / "rank_00000.h5")) {
          kill(pid, SIGKILL);
          killed_mid_save = true;
          staging = e.path().string();
          break;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!killed_mid_save) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(killed_mid_save) << "no save in progress was seen; log: " << read_text_file(dir + "/train.log");
  ASSERT_TRUE(WIFSIGNALED(status));

  // The interrupted save is still a staging directory without an index; `latest` names a complete one.
  ASSERT_TRUE(fs::exists(staging)) << "the save finished before the kill landed";
  EXPECT_FALSE(fs::exists(staging + "/metadata.yaml"));
  std::string latest = read_text_file(cfg.checkpoint.dir + "/latest");
  latest.pop_back();
  const int64_t saved_iteration = std::stoll(latest.substr(5));
  ASSERT_TRUE(fs::exists(cfg.checkpoint.dir + "/" + latest + "/metadata.yaml"));
  EXPECT_EQ(staging, cfg.checkpoint.dir + "/" + iteration_dir_name(saved_iteration + 1) + ".tmp");

  // Resume here; the next step's loss is the one the killed run logged for it.
  std::map<int64_t, double> logged;
  std::ifstream metrics(cfg.logging.metrics_file);
  for (std::string line; std::getline(metrics, line);) {
    auto it = line.find("\"iteration\":"), lo = line.find("\"loss\":");
    if (it == std::string::npos || lo == std::string::npos || line.find("\"train\"") == std::string::npos) continue;
    logged[std::stoll(line.substr(it + 12))] = std::stod(line.substr(lo + 7));
  }
  ASSERT_TRUE(logged.count(saved_iteration + 1));
  cfg.training.train_iters = saved_iteration + 1;
  cfg.logging.metrics_file.clear();
  ParallelState ps = single_process_state();
  RunRecord r = train_run(cfg, ps);
  ASSERT_EQ(r.losses.size(), 1u);
  EXPECT_NEAR(r.losses[0], logged[saved_iteration + 1], 1e-6 * logged[saved_iteration + 1]);
  // That save completed and cleared the leftover staging directory.
  EXPECT_FALSE(fs::exists(staging));
  EXPECT_EQ(read_text_file(cfg.checkpoint.dir + "/latest"), iteration_dir_name(saved_iteration + 1) + "\n");
}

TEST(CheckpointCli, EvalLoadsTheCheckpointOrFailsClearly) {
  const TempDir tmp("evalcli");
  const std::string& dir = tmp.path;
  Config cfg = small_config();
  cfg.training.train_iters = 3;
  cfg.checkpoint.dir = dir + "/c";
  ParallelState ps = single_process_state();
  auto be = make_backend("cpu");
  double expected = 0;
  {
    Trainer t(cfg, ps, *be);
    t.train();
    expected = t.evaluate(*t.make_source("valid"), 2);
  }
  cfg.checkpoint.dir.clear();
  write_text(dir + "/cfg.yaml", dump_config(cfg));
  const std::string base = dir + "/cfg.yaml";
  ASSERT_EQ(run_gpt_train({"eval", "--config", base, "--load", dir + "/c", "--iters", "2",
                           "--set", "logging.metrics_file=" + dir + "/eval.jsonl"}, dir + "/eval.log"), 0)
      << read_text_file(dir + "/eval.log");
  const std::string log = read_text_file(dir + "/eval.log");
  EXPECT_TRUE(contains(log, "loaded checkpoint " + dir + "/c/iter_0000003")) << log;
  const std::string m = read_text_file(dir + "/eval.jsonl");
  auto lo = m.find("\"loss\":");
  ASSERT_NE(lo, std::string::npos) << m;
  EXPECT_NEAR(std::stod(m.substr(lo + 7)), expected, 1e-6 * expected);

  fs::create_directories(dir + "/empty");
  EXPECT_EQ(run_gpt_train({"eval", "--config", base, "--load", dir + "/empty"}, dir + "/fail.log"), 1);
  const std::string fail = read_text_file(dir + "/fail.log");
  EXPECT_TRUE(contains(fail, "nothing to load")) << fail;
}

// ---- convert ----

// An independent reader of the exported file: JSON header + NumPy, Hugging Face GPT-2 names, Conv1D
// [in, out] weights, tied output embedding; prints the mean next-token loss of the given token rows.
const char* kNumpyGpt2 = R"PY(
import json, struct, sys
import numpy as np
path, tokens_path = sys.argv[1], sys.argv[2]
data = open(path, 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
assert (8 + n) % 8 == 0
header = json.loads(data[8:8 + n])
meta = header.pop('__metadata__')
L, C, H = int(meta['n_layer']), int(meta['n_embd']), int(meta['n_head'])
V, T, F = int(meta['vocab_size']), int(meta['n_positions']), int(meta['n_inner'])
eps = float(meta['layer_norm_epsilon'])
want = {'transformer.wte.weight': (V, C), 'transformer.wpe.weight': (T, C),
        'transformer.ln_f.weight': (C,), 'transformer.ln_f.bias': (C,)}
for i in range(L):
    p = 'transformer.h.%d.' % i
    want.update({p + 'ln_1.weight': (C,), p + 'ln_1.bias': (C,), p + 'attn.c_attn.weight': (C, 3 * C),
                 p + 'attn.c_attn.bias': (3 * C,), p + 'attn.c_proj.weight': (C, C), p + 'attn.c_proj.bias': (C,),
                 p + 'ln_2.weight': (C,), p + 'ln_2.bias': (C,), p + 'mlp.c_fc.weight': (C, F),
                 p + 'mlp.c_fc.bias': (F,), p + 'mlp.c_proj.weight': (F, C), p + 'mlp.c_proj.bias': (C,)})
assert set(header) == set(want), sorted(set(header) ^ set(want))
w, end = {}, 0
for k, e in header.items():
    assert e['dtype'] == 'F32' and tuple(e['shape']) == want[k], k
    b, s = e['data_offsets']
    w[k] = np.frombuffer(data[8 + n + b:8 + n + s], dtype='<f4').reshape(e['shape']).astype(np.float64)
    end = max(end, s)
assert 8 + n + end == len(data)
tok = np.fromfile(tokens_path, dtype='<i4').reshape(-1, T + 1)
x, y = tok[:, :-1], tok[:, 1:]
B, D = x.shape[0], C // H
def ln(h, g, b):
    m = h.mean(-1, keepdims=True)
    return (h - m) / np.sqrt(((h - m) ** 2).mean(-1, keepdims=True) + eps) * g + b
def gelu(h):
    return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
def heads(t):
    return t.reshape(B, T, H, D).transpose(0, 2, 1, 3)
h = w['transformer.wte.weight'][x] + w['transformer.wpe.weight'][:T]
future = np.triu(np.ones((T, T), bool), 1)
for i in range(L):
    p = 'transformer.h.%d.' % i
    a = ln(h, w[p + 'ln_1.weight'], w[p + 'ln_1.bias']) @ w[p + 'attn.c_attn.weight'] + w[p + 'attn.c_attn.bias']
    q, k, v = (heads(t) for t in np.split(a, 3, axis=-1))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    s[:, :, future] = -np.inf
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    o = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    h = h + o @ w[p + 'attn.c_proj.weight'] + w[p + 'attn.c_proj.bias']
    m = gelu(ln(h, w[p + 'ln_2.weight'], w[p + 'ln_2.bias']) @ w[p + 'mlp.c_fc.weight'] + w[p + 'mlp.c_fc.bias'])
    h = h + m @ w[p + 'mlp.c_proj.weight'] + w[p + 'mlp.c_proj.bias']
logits = ln(h, w['transformer.ln_f.weight'], w['transformer.ln_f.bias']) @ w['transformer.wte.weight'].T
logits -= logits.max(-1, keepdims=True)
logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
print(repr(-np.take_along_axis(logp, y[..., None], -1).mean()))
)PY";

TEST(CheckpointConvert, ExportIsReadByNumpyGpt2AndImportRoundTripsBitExactly) {
  const TempDir tmp("convert");
  const std::string& dir = tmp.path;
  Config cfg = small_config();
  cfg.training.train_iters = 30;  // far enough from the uniform loss that wrong weights show
  cfg.optimizer.decay_iters = 30;
  cfg.data.synthetic = "pattern";
  cfg.checkpoint.dir = dir + "/trained";
  ParallelState ps = single_process_state();
  auto be = make_backend("cpu");
  Trainer trained(cfg, ps, *be);
  trained.train();
  const auto weights = trained.gather_global_params();
  const double loss = score_first_valid_batch(trained, cfg, dir + "/tokens.bin");

  // Export through the command line, as a user would.
  ASSERT_EQ(run_gpt_train({"convert", "--from", cfg.checkpoint.dir, "--to", dir + "/model.safetensors"},
                          dir + "/convert.log"), 0)
      << read_text_file(dir + "/convert.log");
  write_text(dir + "/gpt2.py", kNumpyGpt2);
  const std::string out = run_python(dir + "/gpt2.py", {dir + "/model.safetensors", dir + "/tokens.bin"});
  ASSERT_EQ(out.rfind("FAILED", 0), std::string::npos) << out;
  EXPECT_NEAR(std::stod(out), loss, 1e-5 * loss) << out;
  EXPECT_LT(loss, 0.8 * std::log(double(cfg.model.vocab_size)));

  // Import into a fresh checkpoint; a new run loads it and holds exactly the trained weights.
  import_hf_gpt2(dir + "/model.safetensors", cfg, dir + "/imported");
  expect_imported(cfg, dir + "/imported", weights, loss);

  // Exporting the imported checkpoint gives the same tensor bytes.
  export_hf_gpt2(dir + "/imported", dir + "/again.safetensors");
  const std::string a = read_text_file(dir + "/model.safetensors"), b = read_text_file(dir + "/again.safetensors");
  uint64_t na = 0, nb = 0;
  std::memcpy(&na, a.data(), 8);
  std::memcpy(&nb, b.data(), 8);
  EXPECT_EQ(a.substr(8 + na), b.substr(8 + nb));

  // Import errors name the tensor and what is wrong.
  Config wrong = cfg;
  wrong.model.hidden_size = 64;
  try {
    import_hf_gpt2(dir + "/model.safetensors", wrong, dir + "/bad");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "transformer.wte.weight has shape [100, 32]")) << e.what();
  }
  fs::resize_file(dir + "/again.safetensors", fs::file_size(dir + "/again.safetensors") - 100);
  try {
    import_hf_gpt2(dir + "/again.safetensors", cfg, dir + "/bad");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "do not fit")) << e.what();
  }
}

}  // namespace
