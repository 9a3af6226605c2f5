// Training loop: model construction for this rank's pipeline chunks, one step = pipeline forward/backward
// over the microbatches, gradient reduction, clipping, AdamW, logging.
#include "app/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "app/config_model.h"
#include "app/flops.h"
#include "app/logging.h"
#include "app/metrics.h"
#include "app/signals.h"
#include "app/watchdog.h"
#include "data/batch_loader.h"
#include "data/shard_source.h"
#include "parallel/checkpoint/checkpoint_save.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/fp8_amax_sync.h"
#include "parallel/data_parallel/grad_sync.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/pipeline/pipeline_schedule.h"

namespace gpt {

Trainer::Trainer(const Config& cfg, ParallelState& ps, Backend& backend)
    : cfg_(cfg), ps_(ps), backend_(backend), spec_(model_spec_from_config(cfg, ps.tp_size(), ps.tp_rank())) {
  const int p = ps.pp_size(), v = static_cast<int>(cfg.parallel.virtual_pipeline);
  validate_pipeline_layout(static_cast<int>(cfg.model.num_layers), p, v);
  for (int c = 0; c < v; ++c) {
    auto [begin, end] = chunk_layer_range(static_cast<int>(cfg.model.num_layers), p, v, ps.pp_rank(), c);
    bool first = ps.pp_rank() == 0 && c == 0;
    bool last = ps.pp_rank() == p - 1 && c == v - 1;
    chunks_.push_back(std::make_unique<ModelChunk>(spec_, begin, end, first, last));
    chunks_.back()->allocate_and_init(backend_, static_cast<uint64_t>(cfg.training.seed), ps.dp_size());
  }
  AdamWConfig ac{static_cast<float>(cfg.optimizer.beta1), static_cast<float>(cfg.optimizer.beta2),
                 static_cast<float>(cfg.optimizer.eps), static_cast<float>(cfg.optimizer.weight_decay)};
  optimizer_ = std::make_unique<DataParallelOptimizer>(ps_, backend_, chunks(), ac,
                                                       cfg.parallel.distributed_optimizer,
                                                       cfg.parallel.bucket_size_mb << 20,
                                                       cfg.parallel.overlap_grad_reduce);
  step_sums_ = backend_.zeros({1 + num_global_params(spec_)}, DType::F64);
  if (spec_.dtype == DType::F16) scaler_ = LossScaler::dynamic_fp16();
  lr_ = LrSchedule{cfg.optimizer.lr, cfg.optimizer.min_lr, cfg.optimizer.warmup_iters,
                   cfg.optimizer.decay_iters ? cfg.optimizer.decay_iters : cfg.training.train_iters,
                   parse_lr_decay_style(cfg.optimizer.lr_decay_style)};
  try {
    train_source_ = make_source("train");
  } catch (const ConfigError&) {
    throw;  // names its key already
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("config {}: {}: {}", cfg.source, cfg.data.train.empty() ? "data (synthetic)" : "data.train",
                                  e.what()));
  }
  if (ps_.rank == 0 && !cfg.logging.metrics_file.empty())
    metrics_ = std::make_unique<MetricsWriter>(cfg.logging.metrics_file);
  // Only rank 0 writes the checkpoint index, and only a run with checkpoint.dir saves one.
  if (ps_.rank == 0 && !cfg.checkpoint.dir.empty()) tokenizer_ = tokenizer_record_from_config(cfg, &tokenizer_files_);
}

Trainer::~Trainer() = default;

std::unique_ptr<SampleSource> make_sample_source(const Config& cfg, const std::string& split) {
  const uint64_t seed = static_cast<uint64_t>(cfg.training.seed);
  if (cfg.data.train.empty() && cfg.data.valid.empty()) {
    // Synthetic: a different stream per split (the pattern is the same for all).
    uint64_t offset = split == "train" ? 0 : split == "valid" ? 1 : 2;
    return make_synthetic_source(cfg.data.synthetic, cfg.model.seq_length, cfg.model.vocab_size, seed + offset);
  }
  if (split == "valid" && !cfg.data.valid.empty())
    return make_shard_source(cfg.data.valid, "all", cfg.data.split, cfg.model.seq_length, seed, cfg.data.tokenizer,
                             cfg.model.vocab_size);
  if (cfg.data.train.empty())
    throw ConfigError("config " + cfg.source + ": data.train is empty but data.valid is set; the " + split +
                      " split needs data.train");
  return make_shard_source(cfg.data.train, split, cfg.data.split, cfg.model.seq_length, seed, cfg.data.tokenizer,
                           cfg.model.vocab_size);
}

std::unique_ptr<SampleSource> Trainer::make_source(const std::string& split) const {
  return make_sample_source(cfg_, split);
}

LayerContext Trainer::layer_context() {
  LayerContext ctx{backend_, *ps_.tp, cfg_.parallel.sequence_parallel, ps_.cp.get()};
  ctx.tp_comm_overlap = cfg_.parallel.tp_comm_overlap;
  return ctx;
}

std::vector<ModelChunk*> Trainer::chunks() {
  std::vector<ModelChunk*> out;
  for (auto& c : chunks_) out.push_back(c.get());
  return out;
}

StepStats Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  auto chunk_list = chunks();
  for (ModelChunk* c : chunk_list) c->params().zero_grad(backend_);

  BatchLoader loader(*train_source_, cfg_.model.seq_length, cfg_.training.micro_batch_size,
                     cfg_.training.global_batch_size, ps_.layout.dp(), ps_.coord.dp, cfg_.model.vocab_size,
                     ps_.cp_size(), ps_.cp_rank());
  StepStats s;
  s.loss_scale = scaler_.scale();
  // The loss is the mean over every token of the global batch, times the loss scale.
  const float grad_scale =
      static_cast<float>(s.loss_scale / double(cfg_.training.global_batch_size * cfg_.model.seq_length));
  LayerContext ctx = layer_context();
  // The step's sums on the device: [0] the losses of this rank's microbatches, [1 + id] the sum of squares
  // of global parameter id's gradient on this rank.
  backend_.fill(step_sums_, 0.f);
  Tensor loss_sum = step_sums_.slice_elems(0, {1});
  Tensor grad_squares = step_sums_.slice_elems(1, {step_sums_.numel() - 1});
  const bool sequence_parallel = cfg_.parallel.sequence_parallel;
  const bool overlap = optimizer_->overlaps_grad_reduce();
  // With overlap, buckets start as the last backward pass completes their gradients; a block's
  // sequence-parallel gradients get their tensor-parallel sum first, as they would after the pipeline.
  const ChunkGradsDone grads_done = [&](int chunk, const std::vector<Parameter*>& params) {
    if (sequence_parallel) reduce_sequence_parallel_grads(ps_, params);
    optimizer_->grads_done(chunk, params);
  };
  run_pipeline_step(ps_, ctx, chunk_list, loader, consumed_, grad_scale, loss_sum, overlap ? &grads_done : nullptr);
  sync_fp8_amaxes_and_update_scales(ps_, chunk_list);  // the next iteration's FP8 scales (none without FP8)

  reduce_tied_embedding(ps_, backend_, chunk_list);
  if (sequence_parallel && !overlap) reduce_sequence_parallel_grads(ps_, chunk_list);
  optimizer_->reduce_gradients();
  optimizer_->add_grad_squares(grad_squares);
  // The step's one wait for the device: the loss and the per-parameter squares come to the host together.
  // Everything after it (clipping factor, AdamW, the ZeRO all-gather) is queued without waiting; the next
  // step's download waits for it.
  std::vector<double> sums(static_cast<size_t>(step_sums_.numel()));
  backend_.download_f64(step_sums_, sums.data());
  s.iteration = ++iteration_;
  s.grad_norm = optimizer_->global_norm(std::vector<double>(sums.begin() + 1, sums.end())) / s.loss_scale;
  // Megatron's position in the schedule: the steps applied so far (skipped ones do not count), so
  // iteration 1 runs at the schedule's start; a checkpoint restores it with Adam's step count.
  s.lr = lr_.at(optimizer_->adam().steps_taken());
  // An Inf/NaN anywhere in the gradients shows in the norm, identically on every rank.
  const bool overflow = !std::isfinite(s.grad_norm);
  if (scaler_.update(overflow)) {
    optimizer_->step(static_cast<float>(s.lr),
                     DataParallelOptimizer::gradient_factor(1.0 / s.loss_scale, s.grad_norm, cfg_.optimizer.clip_grad));
  } else {
    s.skipped = true;
  }
  consumed_ += cfg_.training.global_batch_size;

  // Only tp rank 0 of the last stage contributes its microbatch losses, so the world sum counts each once.
  double loss_total = (ps_.is_last_stage() && ps_.tp_rank() == 0) ? sums[0] : 0.0;
  ps_.world->all_reduce_host(&loss_total, 1);
  s.loss = loss_total / double(loader.microbatches_per_rank() * ps_.dp_size());
  // On a GPU the optimizer's kernels may still be running: the step's time ends once they are queued, and
  // the next step's wait absorbs what is left, so over an interval the times add up to the wall clock.
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

std::vector<StepStats> Trainer::train() {
  std::vector<StepStats> all;
  Communicator* groups[4] = {ps_.tp.get(), ps_.pp.get(), ps_.dp.get(), ps_.cp.get()};
  if (!resume_attempted_ && (!cfg_.checkpoint.load.empty() || !cfg_.checkpoint.dir.empty())) resume();
  if (!resumed_without_moments_.empty() && ps_.rank == 0)
    spdlog::warn("checkpoint {} holds no optimizer state (saved with checkpoint.save_optimizer false, or imported): "
                 "the Adam moments restart from zero at iteration {}",
                 resumed_without_moments_, iteration_);
  if (cfg_.checkpoint.async_save && cfg_.checkpoint.save_interval > 0 && !cfg_.checkpoint.dir.empty())
    prepare_checkpoint_buffer();
  int64_t saved_at = -1;
  while (iteration_ < cfg_.training.train_iters) {
    double comm_s0[4];
    int64_t comm_b0[4];
    for (int g = 0; g < 4; ++g) comm_s0[g] = groups[g]->seconds_spent(), comm_b0[g] = groups[g]->bytes_moved();
    // The whole iteration is timed (step, logging); evaluation batches and checkpoint I/O time themselves.
    WatchdogScope watch("iteration " + std::to_string(iteration_ + 1));
    StepStats s = step();
    const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() / 60;
    const double limit = cfg_.training.exit_duration_mins;
    // Agreed over the world, so every rank leaves after the same step.
    const StopAgreement stop = agree_on_stop(*ps_.world, limit > 0 && minutes > limit);
    // Why the loop ends early, if it does: a signal, the run-time limit, or the exit interval.
    std::string stop_reason;
    if (stop.signal) stop_reason = "stop requested (" + signal_name(stop.signal) + ")";
    else if (stop.time_up)
      stop_reason = fmt::format("training.exit_duration_mins ({}) reached", cfg_.training.exit_duration_mins);
    else if (cfg_.training.exit_interval > 0 && s.iteration % cfg_.training.exit_interval == 0 &&
             s.iteration < cfg_.training.train_iters)
      stop_reason = fmt::format("training.exit_interval ({}) reached", cfg_.training.exit_interval);
    all.push_back(s);
    interval_.steps++;
    interval_.seconds += s.seconds;
    interval_.loss_sum += s.loss;
    interval_.skipped += s.skipped;
    for (int g = 0; g < 4; ++g) {
      interval_.comm_seconds[g] += groups[g]->seconds_spent() - comm_s0[g];
      interval_.comm_bytes[g] += groups[g]->bytes_moved() - comm_b0[g];
    }
    if (s.skipped && ps_.rank == 0)
      spdlog::warn("iteration {}: gradients overflowed (loss scale {}), step skipped", s.iteration, s.loss_scale);
    const bool diverged = count_nonfinite(s);
    if (s.iteration % cfg_.logging.interval == 0 || s.iteration == cfg_.training.train_iters || !stop_reason.empty() ||
        diverged)
      log_interval(s);
    if (diverged) throw_diverged(s);
    poll_checkpoint();
    if (cfg_.eval.interval > 0 && s.iteration % cfg_.eval.interval == 0) evaluate_and_log("valid", cfg_.eval.iters);
    if (cfg_.checkpoint.save_interval > 0 && s.iteration % cfg_.checkpoint.save_interval == 0 &&
        save_unless_nonfinite())
      saved_at = s.iteration;
    if (!stop_reason.empty()) {  // checkpoint below and return
      if (ps_.rank == 0)
        spdlog::log(stop.signal ? spdlog::level::warn : spdlog::level::info, "{}: stopping after iteration {}{}",
                    stop_reason, s.iteration,
                    cfg_.checkpoint.dir.empty() ? " without a checkpoint (checkpoint.dir is empty)" : "");
      break;
    }
  }
  // The last iteration is always saved when there is a checkpoint directory (once, if it was just saved).
  if (!cfg_.checkpoint.dir.empty() && !all.empty() && saved_at != iteration_) save_unless_nonfinite();
  finish_checkpoint();  // the run ends with its last save committed
  if (saver_) saver_->settle();  // and pruned
  return all;
}

bool Trainer::save_unless_nonfinite() {
  // While steps are not finite the previous checkpoint is the one to keep: saving would replace or prune it.
  if (nonfinite_streak_ == 0) {
    start_checkpoint();
    return true;
  }
  if (ps_.rank == 0)
    spdlog::warn("iteration {}: checkpoint not saved: the last {} step(s) had a non-finite loss or gradients",
                 iteration_, nonfinite_streak_);
  return false;
}

bool Trainer::count_nonfinite(const StepStats& s) {
  // fp16's dynamic scaler skips overflowing steps while it backs off; only a skip at the minimum scale,
  // where backing off is over, counts. Every rank sees the same loss and norm, so all decide alike.
  const bool counts = scaler_.dynamic()
                          ? (s.skipped && s.loss_scale <= scaler_.min_scale()) || (!s.skipped && !std::isfinite(s.loss))
                          : s.skipped || !std::isfinite(s.loss);
  nonfinite_streak_ = counts ? nonfinite_streak_ + 1 : 0;
  return cfg_.training.max_nonfinite_steps > 0 && nonfinite_streak_ >= cfg_.training.max_nonfinite_steps;
}

void Trainer::throw_diverged(const StepStats& s) {
  finish_checkpoint();  // a save in flight holds finite weights (saves stop with the first bad step)
  throw TrainingDiverged(fmt::format(
      "training diverged: {} consecutive steps (iterations {} to {}) had a non-finite loss or gradient norm (last: loss "
      "{}, grad norm {}, lr {:.6g}); stopping without saving, so the last checkpoint{} stays the newest. Resume from it "
      "with a lower optimizer.lr or other changes; training.max_nonfinite_steps ({}) sets how many such steps stop "
      "the run (0: never)",
      nonfinite_streak_, s.iteration - nonfinite_streak_ + 1, s.iteration, s.loss, s.grad_norm, s.lr,
      cfg_.checkpoint.dir.empty() ? "" : " in " + cfg_.checkpoint.dir, cfg_.training.max_nonfinite_steps));
}

void Trainer::log_interval(const StepStats& last) {
  const Interval& iv = interval_;
  const double sec = iv.seconds / std::max<int64_t>(1, iv.steps);
  IterationStats it;
  it.iteration = last.iteration;
  it.train_iters = cfg_.training.train_iters;
  it.consumed_samples = consumed_;
  it.ms_per_iter = sec * 1e3;
  it.lr = last.lr;
  it.global_batch = cfg_.training.global_batch_size;
  it.loss = iv.loss_sum / std::max<int64_t>(1, iv.steps);
  it.loss_scale = last.loss_scale;
  it.grad_norm = last.grad_norm;
  it.tokens_per_s = double(cfg_.training.global_batch_size) * double(cfg_.model.seq_length) / sec;
  double flops = model_flops_per_iteration(spec_, cfg_.training.global_batch_size, spec_.padded_vocab());
  it.tflops_per_device = flops / sec / 1e12 / ps_.layout.world();
  it.mfu = cfg_.logging.peak_tflops > 0 ? it.tflops_per_device / cfg_.logging.peak_tflops : -1;
  // Memory of the fullest rank (every rank takes part in this reduction at the same iterations).
  double mem[2] = {double(backend_.memory_in_use()), double(backend_.memory_peak())};
  ps_.world->all_reduce_host(mem, 2, ReduceOp::Max);
  it.mem_in_use_bytes = static_cast<int64_t>(mem[0]);
  it.mem_peak_bytes = static_cast<int64_t>(mem[1]);
  it.skipped_iters = iv.skipped;
  if (ps_.rank == 0) {
    spdlog::info("{}", format_iteration_line(it));
    if (metrics_) metrics_->write_iteration(it);
    if (ps_.layout.world() > 1) {
      const char* names[4] = {"tp", "pp", "dp", "cp"};
      std::string line = fmt::format("layout tp={}{} pp={} vpp={} dp={} | rank 0 time in communication:",
                                     ps_.tp_size(), ps_.cp_size() > 1 ? fmt::format(" cp={}", ps_.cp_size()) : "",
                                     ps_.pp_size(), cfg_.parallel.virtual_pipeline, ps_.layout.dp());
      for (int g = 0; g < (ps_.cp_size() > 1 ? 4 : 3); ++g)
        line += fmt::format(" {} {:.1f}% ({:.2f} MB/step)", names[g], 100.0 * iv.comm_seconds[g] / iv.seconds,
                            iv.comm_bytes[g] / 1e6 / iv.steps);
      spdlog::info("{}", line);
    }
  }
  interval_ = Interval();
}

double Trainer::evaluate(const SampleSource& source, int64_t iters) {
  BatchLoader loader(source, cfg_.model.seq_length, cfg_.training.micro_batch_size,
                     cfg_.training.global_batch_size, ps_.layout.dp(), ps_.coord.dp, cfg_.model.vocab_size,
                     ps_.cp_size(), ps_.cp_rank());
  if (iters <= 0) iters = std::max<int64_t>(1, source.size() / cfg_.training.global_batch_size);
  LayerContext ctx = layer_context();
  auto chunk_list = chunks();
  double loss_sum = 0;
  for (int64_t i = 0; i < iters; ++i) {
    WatchdogScope watch(fmt::format("evaluation batch {} of {} at iteration {}", i + 1, iters, iteration_));
    double l = run_pipeline_eval(ps_, ctx, chunk_list, loader, i * cfg_.training.global_batch_size);
    loss_sum += (ps_.is_last_stage() && ps_.tp_rank() == 0) ? l : 0.0;
  }
  ps_.world->all_reduce_host(&loss_sum, 1);
  return loss_sum / double(iters * loader.microbatches_per_rank() * ps_.dp_size());
}

double Trainer::evaluate_and_log(const std::string& split, int64_t iters) {
  std::unique_ptr<SampleSource> source;
  {
    WatchdogScope watch("opening the " + split + " data", WatchdogScope::kStartup);
    source = make_source(split);
  }
  WatchdogScope watch("evaluation of the " + split + " split at iteration " + std::to_string(iteration_));
  double loss = evaluate(*source, iters);
  if (ps_.rank == 0) {
    spdlog::info(" {} at iteration {} | lm loss: {:.6E} | lm loss PPL: {:.6E} |", split, iteration_, loss,
                 std::exp(loss));
    if (metrics_) metrics_->write_eval(iteration_, split, loss, std::exp(loss));
  }
  return loss;
}

std::vector<std::pair<std::string, std::vector<float>>> Trainer::gather_global_params(bool gradients) {
  // Each parameter's owner writes its shard into a zeroed global array; a world sum assembles it (x + 0
  // is exact). Owners: dp rank 0, tp rank 0 for replicated tensors, never the tied copy.
  std::vector<std::pair<std::string, std::vector<float>>> out;
  std::vector<Parameter*> by_id(num_global_params(spec_), nullptr);
  for (ModelChunk* c : chunks())
    for (auto& p : c->params().params())
      if (!p->tied_copy) by_id[p->global_id] = p.get();
  // Names and shapes are needed on every rank: build them from a full single-rank model description.
  ModelSpec full = spec_;
  full.tp_size = 1;
  full.tp_rank = 0;
  ModelChunk reference(full, 0, spec_.num_layers, true, true);
  for (auto& ref : reference.params().params()) {
    if (ref->tied_copy) continue;
    std::vector<double> global(shape_numel(ref->global_shape), 0.0);
    Parameter* mine = by_id[ref->global_id];
    bool owner = mine && ps_.dp_rank() == 0 && !(mine->tp_replicated && ps_.tp_rank() != 0);
    if (owner) {
      const Tensor& t = gradients ? mine->grad : mine->value;
      std::vector<float> local(t.numel());
      backend_.download(t, local.data());
      const ShardIndexMap to_global(mine->shard, mine->global_shape);
      for (int64_t i = 0; i < (int64_t)local.size(); ++i) global[to_global(i)] = local[i];
    }
    ps_.world->all_reduce_host(global.data(), (int64_t)global.size());
    out.emplace_back(ref->name, std::vector<float>(global.begin(), global.end()));
  }
  return out;
}

}  // namespace gpt
