// Subcommand implementations: train, eval, schedule, config. Each turns its options into a validated
// config and a process grid, then hands over to the trainer or prints what was asked for.
#include "app/config_model.h"
#include "app/commands.h"

#include <mpi.h>
#include <omp.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "app/config.h"
#include "app/launch_env.h"
#include "app/logging.h"
#include "app/metrics.h"
#include "app/plan.h"
#include "app/signals.h"
#include "app/startup_checks.h"
#include "app/trainer.h"
#include "app/watchdog.h"
#include "model/ops/backend.h"
#include "parallel/checkpoint/checkpoint_format.h"
#include "parallel/checkpoint/checkpoint_lock.h"
#include "parallel/comm/host_messages.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/grid/communicator_factory.h"
#include "parallel/grid/context_parallel.h"
#include "parallel/plan/memory_model.h"
#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/grid/process_grid.h"


namespace gpt {

namespace {

// What train and eval share: the subcommand and its options.
struct DistributedRun {
  std::string command;  // train | eval
  std::string config;
  std::vector<std::string> sets;
  std::string load;
  std::optional<int64_t> iters;  // eval only
  bool random_init = false;      // eval only
};

// Evaluation batches that split over `world` ranks. evaluate() averages equal-sized microbatches, so its
// loss is the mean over the samples [0, iters x global_batch_size) whatever the micro batch and the
// data-parallel degree; only the global batch decides which samples are read. When the global batch is
// not a multiple of micro_batch_size x data-parallel size (a batch of 8 on 3 ranks), this picks the micro
// batch (at most the configured one) whose nearest fitting global batch is nearest the configured one,
// the larger micro batch on a tie, and returns a line for the log saying that the sample count changed;
// "" when the config already fits or its layout is wrong anyway (reported by the layout checks).
std::string fit_eval_batch(Config& cfg, int world) {
  const int64_t tp = cfg.parallel.tensor, pp = cfg.parallel.pipeline, cp = cfg.parallel.context;
  if (tp < 1 || pp < 1 || cp < 1 || world % (tp * pp * cp) != 0) return "";
  const int64_t dp = cfg.parallel.data > 0 ? cfg.parallel.data : world / (tp * pp * cp);
  const int64_t mb = cfg.training.micro_batch_size, gb = cfg.training.global_batch_size;
  if (dp < 1 || mb < 1 || gb < 1 || gb % (mb * dp) == 0) return "";
  // The interleaved schedule also needs the microbatch count to be a multiple of the pipeline size.
  const int64_t groups = cfg.parallel.virtual_pipeline > 1 ? pp : 1;
  int64_t best_mb = 0, best_gb = 0;
  for (int64_t m = mb; m >= 1 && m > mb - 4096; --m) {
    const int64_t unit = m * dp * groups;
    const int64_t g = std::max<int64_t>(1, (gb + unit / 2) / unit) * unit;
    if (best_gb == 0 || std::abs(g - gb) < std::abs(best_gb - gb)) {
      best_mb = m;
      best_gb = g;
    }
  }
  cfg.training.micro_batch_size = best_mb;
  cfg.training.global_batch_size = best_gb;
  return fmt::format(
      "the checkpoint's training.global_batch_size {} is not a multiple of micro_batch_size {} x {} data-parallel "
      "rank(s): evaluating batches of {} samples (micro batch {}) instead, so each evaluation batch covers {} "
      "samples rather than {} (--set training.global_batch_size / training.micro_batch_size to choose)",
      gb, mb, dp, best_gb, best_mb, best_gb, gb);
}

}  // namespace

Config config_of_checkpoint(const std::string& path, const std::vector<std::string>& extra_sets) {
  try {
    const std::string dir = resolve_checkpoint(path);
    if (dir.empty())
      throw std::runtime_error("checkpoint " + path + ": nothing to load (no metadata.yaml and no latest pointer)");
    const std::string index = dir + "/" + kMetadataFile;
    const CheckpointMeta meta = checkpoint_meta_from_yaml(read_text_file(index), index);
    std::vector<std::string> sets = {"parallel.tensor=1",          "parallel.pipeline=1",
                                     "parallel.virtual_pipeline=1", "parallel.data=0", "parallel.context=1",
                                     "parallel.sequence_parallel=false", "parallel.distributed_optimizer=false",
                                     "checkpoint.dir=",            "checkpoint.save_interval=0",
                                     "checkpoint.finetune=false"};
    sets.insert(sets.end(), extra_sets.begin(), extra_sets.end());
    return load_config_string(meta.config_yaml, "checkpoint " + index, sets);
  } catch (const std::exception& e) {
    throw StartupError(e.what());
  }
}

namespace {

// eval --load DIR without --config: the checkpoint's own config (config_of_checkpoint) with the command
// line's --set applied last, and evaluation batches fitted to the world size unless --set chooses them.
// The same on every rank; `note` receives what fitting the batch changed.
Config config_from_checkpoint(const DistributedRun& args, int world, std::string& note) {
  Config cfg = config_of_checkpoint(args.load, args.sets);
  const bool batch_set = std::any_of(args.sets.begin(), args.sets.end(), [](const std::string& s) {
    return s.rfind("training.micro_batch_size=", 0) == 0 || s.rfind("training.global_batch_size=", 0) == 0;
  });
  if (!batch_set) {
    try {
      note = fit_eval_batch(cfg, world);
    } catch (const std::exception& e) {
      throw StartupError(e.what());
    }
  }
  return cfg;
}

Config load_or_startup_error(const DistributedRun& args, int world, std::string& note) {
  if (args.config.empty() && args.command == "eval" && !args.load.empty())
    return config_from_checkpoint(args, world, note);
  if (args.config.empty())
    throw StartupError("--config FILE is required for '" + args.command + "'" +
                       (args.command == "eval" ? " (or --load DIR, to use the checkpoint's own config)" : ""));
  try {
    return load_config(args.config, args.sets);
  } catch (const std::exception& e) {
    throw StartupError(e.what());
  }
}

// This host's memory and swap, in bytes (0 if unknown).
double host_memory_bytes() {
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return 0;
  return (static_cast<double>(si.totalram) + static_cast<double>(si.totalswap)) * si.mem_unit;
}

// On the CPU backend the ranks of a host allocate from its memory. When the tensors the memory model
// predicts (exact for this backend) already exceed the host's memory and swap, the run cannot get
// through a step: refuse it before anything is allocated, with the numbers, instead of failing in an
// allocation minutes later. `eval` keeps no activations for a backward pass: there the activations
// counted are only the largest single tensor of a forward pass (the fp32 logits of a microbatch, or its
// widest MLP activation). Collective: every rank reaches the same verdict (the largest host share and
// the smallest host).
void refuse_impossible_host_memory(const Config& cfg, const GridLayout& layout, int ranks_on_host,
                                   bool training) {
  if (cfg.backend != "cpu") return;
  MemoryEstimate e;
  double activations = 0;
  try {
    const ModelDescription dims = model_description_from_config(cfg);
    const LayoutSpec spec = layout_spec_from_config(cfg, layout);
    e = estimate_peak_memory(dims, spec);
    activations = static_cast<double>(training ? e.activations : largest_forward_tensor(dims, spec));
  } catch (const std::exception&) {
    return;  // a layout the memory model cannot describe is reported by the trainer itself
  }
  int share = std::max(ranks_on_host, 1);
  double host = host_memory_bytes();
  MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &host, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  const double per_rank = static_cast<double>(e.static_bytes()) + activations;
  if (host <= 0 || (per_rank >= 0 && per_rank * share <= host)) return;
  auto gib = [](double b) { return fmt::format("{:.4g} GiB", b / (1024.0 * 1024 * 1024)); };
  throw StartupError(fmt::format(
      "config {}: the predicted memory per rank, {} on pipeline stage {} (weights {}, grads {}, optimizer {}, "
      "activations {} at micro_batch_size {} and seq_length {}), times {} rank(s) on one host is more than the "
      "host's {} of memory and swap; reduce training.micro_batch_size, model.seq_length or the model, or spread "
      "the ranks over more hosts",
      cfg.source, per_rank < 0 ? std::string("beyond 8 EiB") : gib(per_rank), e.pp_rank, gib(e.weights),
      gib(e.grads), gib(e.optimizer), gib(activations), cfg.training.micro_batch_size, cfg.model.seq_length, share,
      gib(host)));
}

// Layout rules that need both the model and the world size; identical on every rank.
GridLayout layout_or_startup_error(const Config& cfg, int world) {
  try {
    GridLayout layout = grid_layout_from_config(cfg.parallel, world);
    validate_pipeline_layout(static_cast<int>(cfg.model.num_layers), layout.pp(),
                             static_cast<int>(cfg.parallel.virtual_pipeline));
    const int64_t per_step = cfg.training.micro_batch_size * layout.dp();
    if (cfg.training.global_batch_size % per_step != 0)
      throw std::invalid_argument("training.global_batch_size (" + std::to_string(cfg.training.global_batch_size) +
                                  ") is not divisible by micro_batch_size x data-parallel size (" +
                                  std::to_string(per_step) + ")");
    const int64_t local_tokens = cfg.training.micro_batch_size * cfg.model.seq_length / layout.cp();
    if (cfg.parallel.sequence_parallel && local_tokens % layout.tp() != 0)
      throw std::invalid_argument("parallel.sequence_parallel: micro_batch_size x seq_length / context (" +
                                  std::to_string(local_tokens) + ") must be divisible by tensor (" +
                                  std::to_string(layout.tp()) + ")");
    const int m = static_cast<int>(cfg.training.global_batch_size / per_step);
    validate_schedule_args(layout.pp(), static_cast<int>(cfg.parallel.virtual_pipeline), m);
    return layout;
  } catch (const std::invalid_argument& e) {
    throw StartupError(std::string("config ") + cfg.source + ": " + e.what());
  }
}

// training.threads wins; else OMP_NUM_THREADS; else the host's cores shared among the ranks on it, so
// several ranks per node never oversubscribe the cores.
int set_threads(const Config& cfg, int ranks_on_host) {
  int threads = static_cast<int>(cfg.training.threads);
  if (threads <= 0 && !std::getenv("OMP_NUM_THREADS"))
    threads = std::max(1, omp_get_num_procs() / std::max(1, ranks_on_host));
  if (threads > 0) omp_set_num_threads(threads);
  return omp_get_max_threads();
}

}  // namespace

// The most passes (all ranks together) `gpt-train schedule` prints: about 100 MB of text.
constexpr int64_t kMaxPrintedPasses = 20'000'000;

int schedule_main(const ScheduleOptions& options) {
  try {
    if (options.pp > INT32_MAX || options.vpp > INT32_MAX || options.microbatches > INT32_MAX)
      throw std::runtime_error("--pp, --vpp and --microbatches must each be at most 2147483647");
    int p = static_cast<int>(options.pp);
    int v = static_cast<int>(options.vpp);
    int m = static_cast<int>(options.microbatches);
    validate_schedule_args(p, v, m);
    // Every rank's table is printed and simulated: 2 p v m passes per rank, p ranks.
    const double passes = 2.0 * p * p * v * m;
    if (passes > kMaxPrintedPasses)
      throw std::runtime_error("--pp " + std::to_string(p) + ", --vpp " + std::to_string(v) + " and --microbatches " +
                               std::to_string(m) + " make " + std::to_string(static_cast<int64_t>(passes)) +
                               " passes over all ranks, more than the " + std::to_string(kMaxPrintedPasses) +
                               " this command prints");
    if (options.cp < 1 || options.cp > 1024) throw std::runtime_error("--cp must be 1..1024");
    std::cout << format_schedule(p, v, m);
    if (options.cp > 1) std::cout << "\n" << format_ring_schedule(static_cast<int>(options.cp));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt-train schedule: " << e.what() << "\n";
    return 1;
  }
}

int config_main(const ConfigCommandOptions& options) {
  try {
    Config cfg = options.config.empty() ? load_config_string("{}", "<defaults>", options.sets)
                                        : load_config(options.config, options.sets);
    std::cout << dump_config(cfg);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt-train config: " << e.what() << "\n";
    return 1;
  }
}

namespace {

int run_distributed(const DistributedRun& args) {
  const bool eval = args.command == "eval";
  const bool random_init = eval && args.random_init;
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  install_mpi_error_handler(rank);  // an MPI error on the world communicator names this rank, then aborts
  // A config that fails on one rank only (a node without the file) fails every rank alike, and every rank
  // must run the same effective config.
  auto startup_world = MpiCommunicator::dup(MPI_COMM_WORLD, "world");
  std::string batch_note, error;
  Config cfg;
  try {
    cfg = load_or_startup_error(args, world, batch_note);
  } catch (const StartupError& e) {
    error = e.what();
  }
  agree_or_throw<StartupError>(*startup_world, error);
  if (!args.load.empty()) cfg.checkpoint.load = args.load;
  if (eval && !cfg.checkpoint.load.empty()) cfg.checkpoint.dir.clear();  // eval what --load names
  init_logging(rank, cfg.logging.level, cfg.logging.all_ranks, discover_launch_env().launcher != Launcher::None);
  require_same_config(*startup_world, cfg);
  LaunchInfo launch = reconcile_with_mpi(discover_launch_env());
  // The watchdog from here on (app/watchdog.h): start-up and checkpoint I/O within
  // training.startup_timeout_s, steps and evaluation batches within training.step_timeout_s. Only a
  // launched rank watches its parent: a plain process may outlive the shell that started it (nohup).
  start_process_watchdog({rank, cfg.training.step_timeout_s, launch.env.launcher != Launcher::None, 1.0,
                          cfg.training.startup_timeout_s, /*census=*/true});
  struct StopWatchdog {
    ~StopWatchdog() { stop_process_watchdog(); }
  } stop_watchdog;
  auto startup = std::make_unique<WatchdogScope>("start-up", WatchdogScope::kStartup);
  GridLayout layout = layout_or_startup_error(cfg, world);
  refuse_impossible_host_memory(cfg, layout, launch.env.local_size, args.command == "train");
  // Evaluating weights nobody trained is asked for, never a fallback.
  const std::string use_flags = "pass --load DIR to evaluate a checkpoint, or --random-init to evaluate the randomly "
                                "initialised weights";
  if (eval && !random_init && cfg.checkpoint.load.empty() && cfg.checkpoint.dir.empty())
    throw StartupError("eval: no checkpoint to evaluate (no --load, and checkpoint.load and checkpoint.dir are empty "
                       "in " + cfg.source + "); " + use_flags);
  ParallelState ps = mpi_parallel_state(layout);
  const int threads = set_threads(cfg, launch.env.local_size);
  std::unique_ptr<Backend> backend;
  try {
    backend = make_backend(cfg.backend, launch.env.local_rank);
    backend->set_attention_backend(cfg.model.attention_backend);
  } catch (const std::exception& e) {  // e.g. backend cuda on a node without a visible GPU
    error = fmt::format("config {}: rank {}: {}", cfg.source, rank, e.what());
  }
  agree_or_throw<StartupError>(*startup_world, error);  // every rank stops alike, naming the first that failed
  // On a device backend the tp/pp/dp groups move to the device communicator (NCCL); collective, same
  // point on every rank.
  use_device_communicators(ps, *backend, cfg.parallel.communicator);

  if (rank == 0) {
    spdlog::info("gpt-train {} on {} rank(s), backend {}, launcher {}, {} thread(s) per rank", args.command, world,
                 backend->name(), launcher_name(launch.env.launcher), threads);
    if (const std::string d = backend->details(); !d.empty()) spdlog::info("backend: {}", d);
    if (const std::string w = backend->dtype_warning(dtype_from_name(cfg.precision.dtype)); !w.empty())
      spdlog::warn("precision.dtype={}: {}", cfg.precision.dtype, w);
    spdlog::info("effective config (from {}):\n{}", cfg.source, dump_config(cfg));
    spdlog::info("layout:\n{}", describe_layout(layout, launch.hosts));
    log_layout_checks(cfg, layout, launch.env.local_size);  // predicted memory; planner comparison
    if (!batch_note.empty()) spdlog::warn("eval on {} rank(s): {}", world, batch_note);
  }

  // Found now, not at the first evaluation or save: unreadable or too small validation data, an
  // unwritable or already locked checkpoint directory (the training data opens with the model, below).
  check_validation_data_at_startup(*ps.world, cfg, args.command == "train");
  std::unique_ptr<CheckpointDirLock> lock;
  if (args.command == "train" && !cfg.checkpoint.dir.empty()) {
    std::string warning;
    if (rank == 0) {
      try {
        lock = std::make_unique<CheckpointDirLock>(cfg.checkpoint.dir, cfg.checkpoint.lock_stale_s, &warning);
      } catch (const std::exception& e) {
        error = "config " + cfg.source + ": checkpoint.dir: " + e.what();
      }
      if (!warning.empty()) spdlog::warn("{}", warning);
    }
    agree_or_throw<StartupError>(*ps.world, error);
  }

  // SIGTERM / SIGUSR1 from here on stop every rank after a step with a checkpoint, and the run exits 0.
  if (args.command == "train") install_stop_signal_handlers(rank);
  // Building the model opens the training data: a failure there stops every rank alike too.
  std::unique_ptr<Trainer> built;
  try {
    built = std::make_unique<Trainer>(cfg, ps, *backend);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw<StartupError>(*ps.world, error);
  Trainer& trainer = *built;
  trainer.set_ranks_on_host(launch.env.local_size);
  startup.reset();
  if (args.command == "train") {
    try {
      trainer.train();
    } catch (const CheckpointError& e) {  // raised alike on every rank (parallel/checkpoint/checkpoint.h)
      throw StartupError(e.what());
    } catch (const TrainingDiverged& e) {  // likewise: the loss and norm are the same on every rank
      throw StartupError(e.what());
    }
    return 0;
  }
  // eval --load DIR (or checkpoint.dir) evaluates the checkpoint's weights, loaded into this layout; an
  // explicit --load that finds nothing is an error, and so is a checkpoint.dir without a checkpoint.
  // --random-init loads nothing and evaluates the initial weights of training.seed.
  if (random_init) {
    if (rank == 0)
      spdlog::warn("eval --random-init: NO CHECKPOINT IS LOADED{}; evaluating the RANDOMLY INITIALISED weights of "
                   "training.seed {}: this loss is that of an untrained model",
                   cfg.checkpoint.dir.empty() ? "" : " (checkpoint.dir " + cfg.checkpoint.dir + " is ignored)",
                   cfg.training.seed);
  } else {
    try {
      if (!trainer.resume())
        throw StartupError("eval: no checkpoint in checkpoint.dir " + cfg.checkpoint.dir +
                           " (and checkpoint.load is empty); " + use_flags);
    } catch (const CheckpointError& e) {
      throw StartupError(e.what());
    }
  }
  // --iters 0 evaluates each split once through; the default is eval.iters batches.
  int64_t iters = args.iters.value_or(cfg.eval.iters);
  trainer.evaluate_and_log("valid", iters);
  if (!cfg.data.train.empty()) {
    // Only opening the split may fail softly (a split string that gives it no documents), and alike on
    // every rank; an error during the evaluation itself stops the job like any other.
    std::string unavailable;
    try {
      make_sample_source(cfg, "test");
    } catch (const std::runtime_error& e) {
      unavailable = e.what();
    }
    unavailable = first_error(*ps.world, unavailable);
    if (unavailable.empty()) trainer.evaluate_and_log("test", iters);
    else if (rank == 0) spdlog::warn("test split not evaluated: {}", unavailable);
  }
  return 0;
}

}  // namespace

int train_main(const TrainOptions& o) {
  return run_distributed({"train", o.config, o.sets, o.load, std::nullopt, false});
}

int eval_main(const EvalOptions& o) {
  return run_distributed({"eval", o.config, o.sets, o.load, o.iters, o.random_init});
}

}  // namespace gpt
