// `gpt-train plan`: which layout to run a config on N devices. Loads the config and a hardware
// description (a built-in name or a YAML file, configs/hardware/*.yaml), asks the planner
// (parallel/plan/planner.h) for every valid layout ranked by predicted step time, and prints them with their
// memory per device and time breakdown (or all of them as JSON), with the communication overlaps of
// `--overlap` (parallel/plan/overlap.h; by default what gpt-train does on the config's backend); `--explain`
// prints one layout's full cost breakdown next to the best (app/plan_explain.h). `--probe FILE` measures
// this machine's CPU backend instead and writes a hardware file the planner can use, its GEMM efficiency
// table included. Also here: the start-up checks of
// train/eval (the memory prediction of the chosen layout, and a warning when the planner finds a layout
// predicted to be much faster).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/plan/planner.h"

namespace gpt {

struct Config;
class GridLayout;

// The options of `gpt-train plan` (defined on the command line in app/cli_subcommands.cpp).
struct PlanCommandOptions {
  std::string config;             // --config FILE (required unless --probe)
  std::vector<std::string> sets;  // --set key.path=value
  std::optional<int64_t> gpus;    // --gpus N (required unless --probe)
  std::optional<int64_t> gpus_per_node;  // default: the hardware's (plan), 1 (probe)
  std::string hardware = "h100-80g";     // a built-in name or a YAML hardware file
  bool json = false;
  int64_t top = 20;                          // layouts printed
  std::string recompute = "all";             // none | selective | full | all
  std::string distributed_optimizer = "all";  // on | off | all
  std::string p2p_buffers = "released";      // released | freed
  std::string grad_dtype = "fp32";           // fp32 | compute
  std::string p2p_scatter_gather = "off";    // on | off
  std::string attention = "fused";           // fused | materialized
  std::string loss = "fused";                // fused | unfused
  std::string sp_inputs = "kept";            // kept | regathered
  std::string overlap = "gpt-train";         // none | gpt-train | megatron-core | a list (parallel/plan/overlap.h)
  std::string explain;                       // TP,PP,DP: that layout's cost breakdown next to the best
  std::string probe;                         // --probe FILE: measure this CPU instead
  std::optional<int64_t> threads;            // probe threads per device; default OpenMP's
  std::optional<int64_t> max_context;        // context-parallel degrees tried; default the config's parallel.context
};

// Exit status 0, or 1 with the message on stderr (a config, hardware file or layout error).
int plan_main(const PlanCommandOptions& options);

// A built-in name (a100-80g, h100-80g, h200) or the path of a YAML hardware file. Throws
// std::runtime_error naming the file and key on a bad file, or listing the built-ins for an unknown name.
HardwareSpec load_hardware(const std::string& name_or_file);
// The same from YAML text; `source` names it in errors.
HardwareSpec hardware_from_yaml(const std::string& yaml, const std::string& source);
// Every field as YAML, loadable by hardware_from_yaml.
std::string hardware_to_yaml(const HardwareSpec& hw);

// Start-up checks for the trainer, logged by the caller's rank: the predicted memory per rank of this
// layout, and, with a hardware description (logging.hardware; h100-80g by default on cuda; skipped with
// a note on cpu without one), a warning when the planner predicts another layout to be more than 25%
// faster, naming it. `ranks_per_node` is the launch's (0: the hardware's).
void log_layout_checks(const Config& cfg, const GridLayout& layout, int ranks_per_node = 0);
// The check itself: warnings (does not fit; predicted > 25% slower than the best layout, named) and, in
// *info when given, the one-line verdict otherwise.
std::vector<std::string> layout_check_warnings(const Config& cfg, const GridLayout& layout, const HardwareSpec& hw,
                                               int ranks_per_node = 0, std::string* info = nullptr);

// Measures this machine's CPU backend with `threads` threads per device and returns the description
// (the GEMM efficiency table and peaks, attention and memory-bound rates; memcpy as the intra-node link).
HardwareSpec probe_cpu(int threads, int devices_per_node);

}  // namespace gpt
