// `gpt-train generate` (app/generate.h): loads a checkpoint into a one-rank model through the trainer
// (any saved layout is resharded on load; only the weights are read), finds the tokenizer in the
// checkpoint's record, and decodes each sample with a key/value cache (ModelChunk::decode): the prompt
// in one pass, then one token per step. A sample starts at a document boundary (the end-of-document id,
// which the training data puts before every document), followed by the prompt's ids; it stops at the
// end-of-document id, after --max-new-tokens, or when it fills model.seq_length. Samples go to stdout,
// the timing summary to stderr.
#include "app/config_model.h"
#include "app/generate.h"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>
#include <memory>
#include <random>
#include <stdexcept>

#include "app/commands.h"
#include "app/config.h"
#include "app/logging.h"
#include "app/sampling.h"
#include "app/trainer.h"
#include "app/watchdog.h"
#include "data/tokenizer.h"
#include "model/ops/backend.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/checkpoint_format.h"
#include "parallel/grid/communicator_factory.h"
#include "parallel/grid/process_grid.h"

namespace gpt {

namespace {

namespace fs = std::filesystem;

struct GenerateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A tokenizer from the command line's --tokenizer and files.
std::unique_ptr<Tokenizer> tokenizer_from_flags(const GenerateOptions& o) {
  if (o.tokenizer == "bytes") {
    if (!o.vocab_file.empty() || !o.merges_file.empty())
      throw GenerateError("--tokenizer bytes takes no --vocab-file or --merges-file");
    return make_byte_tokenizer();
  }
  if (o.tokenizer == "gpt2") {
    if (o.vocab_file.empty() || o.merges_file.empty())
      throw GenerateError("--tokenizer gpt2 needs --vocab-file vocab.json and --merges-file merges.txt");
    return make_gpt2_tokenizer(o.vocab_file, o.merges_file);
  }
  if (o.tokenizer == "spm") {
    if (o.vocab_file.empty()) throw GenerateError("--tokenizer spm needs --vocab-file M.model");
    return make_spm_tokenizer(o.vocab_file);
  }
  throw GenerateError("--tokenizer '" + o.tokenizer + "' is not one of bytes, gpt2, spm");
}

// The tokenizer the checkpoint records (files from its tokenizer/ directory), or the one the flags name,
// which must then be the recorded one when there is a record.
std::unique_ptr<Tokenizer> generation_tokenizer(const GenerateOptions& o, const TokenizerRecord& rec,
                                                const std::string& dir) {
  const std::string where = "checkpoint " + dir;
  std::unique_ptr<Tokenizer> tok;
  if (o.tokenizer.empty() && (!o.vocab_file.empty() || !o.merges_file.empty()))
    throw GenerateError("--vocab-file and --merges-file need --tokenizer gpt2 or spm");
  if (!o.tokenizer.empty()) {
    tok = tokenizer_from_flags(o);
  } else if (rec.empty()) {
    throw GenerateError(where + " records no tokenizer (it was trained on synthetic data, or saved before checkpoints "
                                "recorded one): pass --tokenizer bytes|gpt2|spm with its --vocab-file / --merges-file");
  } else if (rec.name == "bytes") {
    tok = make_byte_tokenizer();
  } else {
    auto file = [&](const char* role) {
      auto it = rec.files.find(role);
      if (it == rec.files.end())
        throw GenerateError(where + " records the " + rec.name + " tokenizer (" + rec.hash +
                            ") but not its files (the training config had no data.vocab_file" +
                            (rec.name == "gpt2" ? std::string(" / data.merges_file") : "") + "): pass --tokenizer " +
                            rec.name + (rec.name == "gpt2" ? " --vocab-file vocab.json --merges-file merges.txt"
                                                           : " --vocab-file M.model"));
      return (fs::path(dir) / it->second).string();
    };
    tok = rec.name == "gpt2" ? make_gpt2_tokenizer(file("vocab"), file("merges")) : make_spm_tokenizer(file("model"));
  }
  if (!rec.empty() && (tok->name() != rec.name || tok->hash() != rec.hash))
    throw GenerateError(where + " was trained on data tokenized with " + rec.name + "@" + rec.hash + ", not " +
                        tok->name() + "@" + tok->hash() + (o.tokenizer.empty() ? " (its tokenizer/ files changed)" : ""));
  return tok;
}

std::string read_prompt(const GenerateOptions& o) {
  if (o.prompt_given && !o.prompt_file.empty()) throw GenerateError("give --prompt or --prompt-file, not both");
  if (!o.prompt_file.empty()) {
    const std::string text = read_file_bytes(o.prompt_file, "--prompt-file");
    if (text.empty()) throw GenerateError("--prompt-file " + o.prompt_file + " is empty; omit it to sample unconditionally");
    return text;
  }
  if (o.prompt_given && o.prompt.empty())
    throw GenerateError("--prompt is empty; omit --prompt to sample from the start of a document");
  return o.prompt;
}

// The context a sample starts from: the end-of-document id (a document boundary), then the prompt.
std::vector<int32_t> prompt_ids(const std::string& prompt, const Tokenizer& tok, int64_t model_vocab,
                                int64_t seq_length) {
  std::vector<int32_t> ids = {static_cast<int32_t>(tok.eod_id())};
  if (tok.eod_id() >= model_vocab)
    throw GenerateError(fmt::format("the {} tokenizer's end-of-document id {} is outside the model's vocabulary of {} "
                                    "ids: this is not the tokenizer the model was trained with (--tokenizer)",
                                    tok.name(), tok.eod_id(), model_vocab));
  tok.encode(prompt, ids);
  for (size_t i = 1; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= model_vocab)
      throw GenerateError(fmt::format("the prompt's token {} (id {}, '{}') is outside the model's vocabulary of {} ids: "
                                      "the {} tokenizer cannot encode this prompt for this model",
                                      i, ids[i], repair_utf8(tok.decode({ids[i]})), model_vocab, tok.name()));
  if (static_cast<int64_t>(ids.size()) > seq_length)
    throw GenerateError(fmt::format("the prompt is {} tokens (after the start-of-document token), more than the {} the "
                                    "model's seq_length of {} leaves room for",
                                    ids.size() - 1, seq_length - 1, seq_length));
  return ids;
}

struct Sample {
  std::vector<int32_t> tokens;  // generated, without the prompt
  std::string stop;             // why it stopped
};

}  // namespace

int generate_main(const GenerateOptions& o) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 1)
    throw StartupError(fmt::format("generate runs on one rank (it loads any checkpoint at tensor and pipeline size "
                                   "1), but was started on {}: run it without mpirun/srun, or with -n 1",
                                   world));
  if (o.load.empty()) throw StartupError("generate needs --load DIR (a checkpoint, or a directory with a latest pointer)");
  if (o.max_new_tokens < 1) throw StartupError(fmt::format("--max-new-tokens {}: expected >= 1", o.max_new_tokens));
  if (o.num_samples < 1) throw StartupError(fmt::format("--num-samples {}: expected >= 1", o.num_samples));
  const SamplingOptions sampling{o.temperature, o.top_k, o.top_p};
  try {
    check_sampling_options(sampling);
  } catch (const std::invalid_argument& e) {
    throw StartupError(e.what());
  }
  install_mpi_error_handler(0);

  // The model: the checkpoint's config (or --config) on one rank, weights only, no data, no metrics file.
  std::vector<std::string> sets = {"parallel.tensor=1",        "parallel.pipeline=1",
                                   "parallel.virtual_pipeline=1", "parallel.data=1", "parallel.context=1",
                                   "parallel.sequence_parallel=false", "parallel.distributed_optimizer=false",
                                   "data.train=[]",            "data.valid=[]",
                                   "logging.metrics_file=",    "training.micro_batch_size=1",
                                   "training.global_batch_size=1", "logging.level=warn"};
  if (!o.backend.empty()) sets.push_back("backend=" + o.backend);
  sets.insert(sets.end(), o.sets.begin(), o.sets.end());
  Config cfg;
  try {
    cfg = o.config.empty() ? config_of_checkpoint(o.load, sets) : load_config(o.config, sets);
  } catch (const std::exception& e) {
    throw StartupError(e.what());
  }
  init_logging(0, cfg.logging.level, false, false);

  // One resolved checkpoint directory for the tokenizer record and the weights alike (a `latest` that
  // moves meanwhile changes neither).
  std::string dir;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> context;
  GridLayout layout;
  try {
    dir = resolve_checkpoint(o.load);
    if (dir.empty()) throw GenerateError("checkpoint " + o.load + ": nothing to load (no metadata.yaml and no latest pointer)");
    const std::string index = dir + "/" + kMetadataFile;
    const CheckpointMeta meta = checkpoint_meta_from_yaml(read_text_file(index), index);
    tok = generation_tokenizer(o, meta.tokenizer, dir);
    context = prompt_ids(read_prompt(o), *tok, cfg.model.vocab_size, cfg.model.seq_length);
    layout = grid_layout_from_config(cfg.parallel, 1);
  } catch (const std::exception& e) {
    throw StartupError(e.what());
  }
  cfg.checkpoint.load = dir;
  cfg.checkpoint.finetune = true;  // the weights only: no Adam moments are read
  cfg.checkpoint.dir.clear();

  ParallelState ps = mpi_parallel_state(layout);
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Trainer> trainer;
  try {  // a backend without its device, a model that does not fit: stop with the reason
    backend = make_backend(cfg.backend, 0);
    backend->set_attention_backend(cfg.model.attention_backend);
    use_device_communicators(ps, *backend, cfg.parallel.communicator);
    trainer = std::make_unique<Trainer>(cfg, ps, *backend);
    if (!trainer->resume()) throw StartupError("checkpoint " + o.load + ": nothing to load");
  } catch (const StartupError&) {
    throw;
  } catch (const std::exception& e) {
    throw StartupError("config " + cfg.source + ": " + e.what());
  }
  ModelChunk& model = *trainer->chunks().front();
  LayerContext ctx{*backend, *ps.tp, false};

  // Candidates: ids the model knows and the tokenizer can decode; padding columns never win.
  const int64_t padded = trainer->spec().padded_vocab();
  const int64_t candidates = std::min<int64_t>(cfg.model.vocab_size, tok->vocab_size());
  const int64_t capacity = std::min<int64_t>(cfg.model.seq_length, static_cast<int64_t>(context.size()) + o.max_new_tokens);
  std::vector<float> logits(padded);
  int64_t new_tokens = 0, steps = 0;  // steps: single-token decoding passes, which the rate counts
  double prompt_seconds = 0, step_seconds = 0;
  using Clock = std::chrono::steady_clock;
  for (int64_t s = 0; s < o.num_samples; ++s) {
    std::mt19937_64 rng(o.seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(s));
    ModelChunk::KvCache cache = model.make_kv_cache(*backend, capacity);
    Tensor ids = backend->empty({static_cast<int64_t>(context.size())}, DType::I32);
    backend->upload_i32(context.data(), ids);
    auto t0 = Clock::now();
    Tensor out = model.decode(ctx, ids, cache);
    backend->download(out, logits.data());
    prompt_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    Sample sample;
    Tensor one = backend->empty({1}, DType::I32);
    t0 = Clock::now();
    while (true) {
      const int32_t next = sample_token(std::span<const float>(logits.data(), candidates), sampling, rng);
      if (next == tok->eod_id()) {
        sample.stop = "end of document";
        break;
      }
      sample.tokens.push_back(next);
      if (static_cast<int64_t>(sample.tokens.size()) == o.max_new_tokens) {
        sample.stop = "--max-new-tokens";
        break;
      }
      if (cache.length == cache.capacity) {
        sample.stop = fmt::format("model.seq_length ({})", cfg.model.seq_length);
        break;
      }
      backend->upload_i32(&next, one);
      out = model.decode(ctx, one, cache);
      ++steps;
      backend->download(out, logits.data());
    }
    step_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    new_tokens += static_cast<int64_t>(sample.tokens.size());
    if (o.num_samples > 1)
      std::printf("--- sample %lld of %lld (%zu tokens, stopped at %s) ---\n", static_cast<long long>(s + 1),
                  static_cast<long long>(o.num_samples), sample.tokens.size(), sample.stop.c_str());
    // Prompt and continuation decoded together, so a piece that joins them keeps its spacing; the text
    // may hold NUL bytes.
    std::vector<int32_t> all(context.begin() + 1, context.end());
    all.insert(all.end(), sample.tokens.begin(), sample.tokens.end());
    const std::string text = repair_utf8(tok->decode(all)) + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  std::fprintf(stderr,
               "generate: %lld sample(s), %lld new token(s); %lld one-token decoding steps in %.3f s: %.1f tokens/s "
               "(prompt of %zu tokens plus the start of document: %.3f s per sample); backend %s, %s\n",
               static_cast<long long>(o.num_samples), static_cast<long long>(new_tokens), static_cast<long long>(steps),
               step_seconds, steps / std::max(step_seconds, 1e-9), context.size() - 1,
               prompt_seconds / o.num_samples, backend->name().c_str(), cfg.precision.dtype.c_str());
  return 0;
}

}  // namespace gpt
