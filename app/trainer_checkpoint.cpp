// The trainer's side of checkpointing: describes this rank's model to the distributed checkpoint
// (parallel/checkpoint/checkpoint.h), and restores the scalars that make a resumed run continue exactly where the
// saved one stopped. Initialisation is counter-based and the data order depends only on the consumed
// samples, so weights, master weights, Adam moments and step count (which fixes the LR schedule: skipped
// steps do not advance it), the iteration, consumed samples and the loss-scaler state are the whole
// training state.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <optional>

#include "app/trainer.h"
#include "data/shard_source.h"
#include "data/tokenizer.h"
#include "app/watchdog.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/checkpoint_fp8.h"
#include "parallel/checkpoint/checkpoint_save.h"
#include "parallel/data_parallel/data_parallel.h"

namespace gpt {

namespace {

CheckpointModel checkpoint_model(Trainer& t) {
  CheckpointModel m;
  m.ps = &t.parallel_state();
  m.backend = &t.backend();
  m.chunks = t.chunks();
  m.optimizer = &t.optimizer();
  m.dtype = t.config().precision.dtype;
  m.virtual_pipeline = t.config().parallel.virtual_pipeline;
  m.vocab_size = t.spec().vocab_size;
  m.padded_vocab = t.spec().padded_vocab();
  m.config_yaml = dump_config(t.config());
  m.default_config_yaml = dump_config(Config{});
  m.save_optimizer_state = t.config().checkpoint.save_optimizer;
  m.tokenizer = t.tokenizer();
  m.tokenizer_files = t.tokenizer_files();
  // Every global tensor with its global shape: a full single-rank description (no memory is allocated).
  ModelSpec full = t.spec();
  full.tp_size = 1;
  full.tp_rank = 0;
  ModelChunk whole(full, 0, full.num_layers, true, true);
  for (auto& p : whole.params().params())
    if (!p->tied_copy) m.global_shapes[p->name] = p->global_shape;
  const int64_t history = full.fp8.history_len;
  for (Fp8TensorScale* s : whole.fp8_scales().all()) m.fp8_shapes[s->name] = {2 + history};
  for (ModelChunk* c : m.chunks)
    for (Fp8TensorScale* s : c->fp8_scales().all()) {
      const std::vector<float> packed = pack_fp8_scale(*s, history);
      Tensor state = t.backend().empty({2 + history});
      t.backend().upload(packed.data(), state);
      m.fp8_state.emplace_back(s->name, state);
    }
  return m;
}

}  // namespace

TokenizerRecord tokenizer_record_from_config(const Config& cfg, std::map<std::string, std::string>* files) {
  TokenizerRecord r;
  const DataConfig& d = cfg.data;
  const std::vector<std::string>& shards = d.train.empty() ? d.valid : d.train;
  if (shards.empty()) return r;  // synthetic data: no tokenizer
  const ShardDataInfo info = read_shard_data_info(shards);
  r.name = info.tokenizer;
  r.hash = info.tokenizer_hash;
  r.vocab_size = info.vocab_size;
  r.eod_id = info.eod_id;
  if (d.vocab_file.empty()) {
    if (!d.merges_file.empty())
      throw ConfigError("config " + cfg.source + ": data.merges_file is set but data.vocab_file is not");
    return r;
  }
  if (r.name == "bytes")
    throw ConfigError("config " + cfg.source + ": data.vocab_file " + d.vocab_file +
                      " is set, but the data was tokenized with bytes, which has no files: remove data.vocab_file");
  std::unique_ptr<Tokenizer> tok;
  try {
    if (r.name == "gpt2") {
      if (d.merges_file.empty())
        throw ConfigError("config " + cfg.source + ": data.vocab_file is set for the gpt2 tokenizer but data.merges_file "
                          "(merges.txt) is not");
      tok = make_gpt2_tokenizer(d.vocab_file, d.merges_file);
      *files = {{"vocab", read_file_bytes(d.vocab_file, "data.vocab_file")},
                {"merges", read_file_bytes(d.merges_file, "data.merges_file")}};
    } else {
      tok = make_spm_tokenizer(d.vocab_file);
      *files = {{"model", read_file_bytes(d.vocab_file, "data.vocab_file")}};
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError("config " + cfg.source + ": data.vocab_file: " + e.what());
  }
  if (tok->hash() != r.hash)
    throw ConfigError("config " + cfg.source + ": data.vocab_file " + d.vocab_file + " is " + tok->name() + "@" +
                      tok->hash() + ", but the data was tokenized with " + r.name + "@" + r.hash +
                      ": name the files the shards were made with");
  return r;
}

void Trainer::save_checkpoint() {
  start_checkpoint();
  finish_checkpoint();
  saver_->settle();  // and pruned
}

CheckpointSaver& Trainer::saver() {
  if (!saver_)
    saver_ = std::make_unique<CheckpointSaver>(backend_, cfg_.checkpoint.dir, cfg_.checkpoint.keep_last,
                                               cfg_.checkpoint.async_save, ranks_on_host_);
  return *saver_;
}

void Trainer::prepare_checkpoint_buffer() { saver().prepare(checkpoint_model(*this)); }

void Trainer::start_checkpoint() {
  if (cfg_.checkpoint.dir.empty())
    throw ConfigError("config " + cfg_.source + ": checkpoint.dir is empty, so there is nowhere to save a checkpoint");
  finish_checkpoint();  // at most one save in flight; and the lineage's parent is the one just committed
  CheckpointProgress progress{iteration_,       consumed_,       optimizer_->adam().steps_taken(), cfg_.training.seed,
                              scaler_.dynamic(), scaler_.state(), lineage_parent_,  lineage_parent_id_};
  WatchdogScope watch("saving the checkpoint of iteration " + std::to_string(iteration_), WatchdogScope::kStartup);
  const double blocked = saver().start(checkpoint_model(*this), progress);
  if (cfg_.checkpoint.async_save && ps_.rank == 0)
    spdlog::info("checkpoint of iteration {}: copied to host memory in {:.3f} s; writing {} in the background",
                 iteration_, blocked, cfg_.checkpoint.dir);
  if (!cfg_.checkpoint.async_save) finish_checkpoint();
}

void Trainer::poll_checkpoint() {
  if (!saver_ || !saver_->in_flight()) return;
  if (auto r = saver_->poll()) checkpoint_committed(*r);
}

void Trainer::finish_checkpoint() {
  if (!saver_ || !saver_->in_flight()) return;
  WatchdogScope watch("waiting for the checkpoint being written to commit", WatchdogScope::kStartup);
  if (auto r = saver_->wait()) checkpoint_committed(*r);
}

int64_t Trainer::checkpoint_host_buffer_bytes() const { return saver_ ? saver_->host_buffer_bytes() : 0; }

void Trainer::checkpoint_committed(const CheckpointSaveReport& r) {
  lineage_parent_ = std::filesystem::path(r.path).filename().string();
  lineage_parent_id_ = r.id;
  if (ps_.rank != 0) return;
  auto rate = [](double bytes, double s) { return bytes / 1e6 / std::max(s, 1e-9); };
  if (r.async)
    spdlog::info("saved checkpoint {} at iteration {}: {} bytes | blocking copy {:.3f} s ({:.1f} MB/s) | background "
                 "write {:.3f} s ({:.1f} MB/s) | commit {:.3f} s",
                 r.path, r.iteration, r.bytes, r.blocking_seconds, rate(r.snapshot_bytes, r.blocking_seconds),
                 r.write_seconds, rate(r.bytes, r.write_seconds), r.commit_seconds);
  else
    spdlog::info("saved checkpoint {} at iteration {}: {} bytes in {:.3f} s ({:.1f} MB/s) | write {:.3f} s | commit "
                 "{:.3f} s",
                 r.path, r.iteration, r.bytes, r.seconds, rate(r.bytes, r.seconds), r.write_seconds, r.commit_seconds);
  for (const std::string& note : r.notes) spdlog::info("checkpoint {}: {}", cfg_.checkpoint.dir, note);
}

bool Trainer::resume() {
  resume_attempted_ = true;
  if (cfg_.checkpoint.dir.empty() && cfg_.checkpoint.load.empty()) return false;
  CheckpointModel model = checkpoint_model(*this);
  WatchdogScope watch("loading a checkpoint", WatchdogScope::kStartup);
  // The run's own checkpoints come first: a restart after a failure continues from its latest save even
  // when checkpoint.load names where the run started (a pretrained model, say). checkpoint.load must
  // then hold a checkpoint.
  std::optional<CheckpointLoadReport> r;
  if (!cfg_.checkpoint.dir.empty()) r = load_distributed_checkpoint(cfg_.checkpoint.dir, false, model);
  if (r && !cfg_.checkpoint.load.empty() && ps_.rank == 0)
    spdlog::info("checkpoint.dir {} has a checkpoint: resuming it rather than checkpoint.load {}",
                 cfg_.checkpoint.dir, cfg_.checkpoint.load);
  const bool finetune = !r && cfg_.checkpoint.finetune;
  // The lineage this run continues, for pruning: a checkpoint of checkpoint.dir (saves elsewhere start a
  // new one).
  if (r) {
    lineage_parent_ = std::filesystem::path(r->path).filename().string();
    lineage_parent_id_ = r->meta.id;
  }
  if (!r && !cfg_.checkpoint.load.empty()) {
    model.load_optimizer_state = !finetune;  // fine-tuning: the moments start at zero
    r = load_distributed_checkpoint(cfg_.checkpoint.load, true, model);
  }
  if (r && !r->note.empty() && ps_.rank == 0) spdlog::warn("{}", r->note);
  if (!r) {
    if (ps_.rank == 0) spdlog::info("no checkpoint in {}: starting from iteration 0", cfg_.checkpoint.dir);
    return false;
  }
  if (finetune) {
    // The weights (and, for 16-bit compute, their fp32 masters) are loaded; the rest starts afresh.
    optimizer_->adam().set_steps_taken(0);
    set_progress(0, 0);
    if (ps_.rank == 0)
      spdlog::info("fine-tuning from checkpoint {} (saved at iteration {}): its weights only; starting at iteration 0 "
                   "with fresh optimizer state",
                   r->path, r->meta.iteration);
    return true;
  }
  const CheckpointMeta& meta = r->meta;
  if (!meta.has_optimizer_state) resumed_without_moments_ = r->path;
  set_progress(meta.iteration, meta.consumed_samples);
  optimizer_->adam().set_steps_taken(meta.optimizer_steps);
  // The scaler state belongs to fp16's dynamic scaler; other dtypes keep their constant scale.
  if (scaler_.dynamic() && meta.loss_scaler_dynamic) scaler_.set_state(meta.loss_scaler);
  if (ps_.rank == 0) {
    const SavedLayout& l = meta.layout;
    spdlog::info("loaded checkpoint {} (iteration {}, {} consumed samples, saved at tp={} pp={} vpp={} dp={}{} in {}):"
                 " {} bytes in {:.3f} s ({:.1f} MB/s)",
                 r->path, meta.iteration, meta.consumed_samples, l.tensor, l.pipeline, l.virtual_pipeline, l.data,
                 l.distributed_optimizer ? " zero1" : "", meta.dtype, r->bytes_read, r->seconds,
                 r->bytes_read / 1e6 / std::max(r->seconds, 1e-9));
    if (meta.rng_seed != cfg_.training.seed)
      spdlog::warn("training.seed {} differs from the checkpoint's {}: the remaining samples come in another order",
                   cfg_.training.seed, meta.rng_seed);
    for (const std::string& d : config_differences(meta.config_yaml, model.config_yaml))
      if (d.rfind("checkpoint.", 0) != 0) spdlog::info("  config differs from the checkpoint's: {}", d);
  }
  return true;
}

}  // namespace gpt
