// `gpt-train plan` (see app/plan.h): hardware files, the printed and JSON rankings and the trainer's start-up
// checks; the CPU probe is app/plan_probe.cpp.
#include "app/config_model.h"
#include "app/plan.h"

#include <omp.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "app/config.h"
#include "app/plan_explain.h"
#include "model/ops/backend.h"
#include "parallel/grid/process_grid.h"


namespace gpt {

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// ---- hardware files ----

struct HardwareField {
  const char* key;
  double HardwareSpec::*field;
  const char* help;
};

const std::vector<HardwareField>& hardware_fields() {
  static const std::vector<HardwareField> fields = {
      {"peak_tflops_16bit", &HardwareSpec::peak_tflops_16bit, "dense bf16/fp16 matmul peak per device, TFLOP/s"},
      {"peak_tflops_fp32", &HardwareSpec::peak_tflops_fp32, "dense fp32 matmul peak per device, TFLOP/s"},
      {"attention_efficiency", &HardwareSpec::attention_efficiency,
       "attention core rate over peak, counting dense 4bs^2h FLOPs (0 = the best gemm_efficiency entry)"},
      {"in_step_compute_fraction", &HardwareSpec::in_step_compute_fraction,
       "fraction of the GEMM and attention rates kernels keep inside a training step (1 = isolated kernels)"},
      {"sm_count", &HardwareSpec::sm_count,
       "streaming multiprocessors per device, for the SMs communication kernels take (0 = unknown)"},
      {"memory_gib", &HardwareSpec::memory_gib, "device memory, GiB"},
      {"memory_reserved_gib", &HardwareSpec::memory_reserved_gib, "memory not available to tensors, GiB"},
      {"memory_bandwidth_gbs", &HardwareSpec::memory_bandwidth_gbs, "device memory bandwidth, GB/s"},
      {"memory_efficiency", &HardwareSpec::memory_efficiency, "fraction of it memory-bound kernels achieve"},
      {"loss_bandwidth_gbs", &HardwareSpec::loss_bandwidth_gbs,
       "cross-entropy passes' rate in the bytes the time model charges, GB/s (0 = memory bandwidth)"},
      {"optimizer_bandwidth_gbs", &HardwareSpec::optimizer_bandwidth_gbs,
       "AdamW, norm and clipping's rate in the bytes the time model charges, GB/s (0 = memory bandwidth)"},
      {"intra_node_bandwidth_gbs", &HardwareSpec::intra_node_bandwidth_gbs,
       "device-to-device bandwidth inside a node, per direction, GB/s"},
      {"intra_node_efficiency", &HardwareSpec::intra_node_efficiency, "fraction of it collectives achieve"},
      {"intra_node_latency_us", &HardwareSpec::intra_node_latency_us, "per message step inside a node, us"},
      {"inter_node_bandwidth_gbs", &HardwareSpec::inter_node_bandwidth_gbs, "each device's network link, GB/s"},
      {"inter_node_efficiency", &HardwareSpec::inter_node_efficiency, "fraction of it collectives achieve"},
      {"inter_node_latency_us", &HardwareSpec::inter_node_latency_us, "per message step between nodes, us"},
  };
  return fields;
}

const char* kGemmTableHelp =
    "[m, n, k, efficiency] rows: the fraction of the dtype's peak a product [m, k] x [k, n] achieves";

// The gemm_efficiency table: a sequence of [m, n, k, efficiency] sequences. `fail` throws.
template <typename Fail>
GemmEfficiencyTable gemm_table_from_yaml(const YAML::Node& node, Fail&& fail) {
  if (!node.IsSequence()) fail("key 'gemm_efficiency' needs a list of " + std::string(kGemmTableHelp));
  std::vector<GemmShapeEfficiency> entries;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& row = node[i];
    const std::string where = "gemm_efficiency entry " + std::to_string(i + 1);
    if (!row.IsSequence() || row.size() != 4) fail(where + " must be [m, n, k, efficiency]");
    double v[4] = {0, 0, 0, 0};
    for (size_t j = 0; j < 4; ++j) {
      const std::string text = row[j].IsScalar() ? row[j].as<std::string>() : "";
      try {
        size_t used = 0;
        v[j] = std::stod(text, &used);
        if (used != text.size()) throw std::invalid_argument(text);
      } catch (const std::exception&) {
        fail(where + " must hold four numbers, got '" + text + "'");
      }
    }
    entries.push_back({v[0], v[1], v[2], v[3]});
  }
  return GemmEfficiencyTable(std::move(entries));
}

std::string pct(double x) { return fmt::format("{:.1f}%", 100 * x); }

std::string seconds(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

// ---- one table row ----

std::string row(int rank, const PlanEntry& e) {
  const LayoutSpec& l = e.layout;
  const MemoryEstimate& m = e.memory;
  const TimeEstimate& t = e.time;
  return fmt::format(
      "{:>4} {:>3} {:>3} {:>3} {:>3} {:>4} {:>3} {:<9} {:<4} | {:6.2f} {:6.2f} {:6.2f} {:7.2f} {:7.2f} | {:8.3f} {:7.3f} "
      "{:7.3f} {:7.3f} {:7.3f} {:6.1f}% | {:8.3f} {:8.1f}",
      rank > 0 ? std::to_string(rank) : "-", l.tp, l.cp, l.pp, l.vpp, l.dp, l.micro_batch, recompute_name(l.recompute),
      l.distributed_optimizer ? "on" : "off", m.weights / GiB, m.grads / GiB, m.optimizer / GiB, m.activations / GiB,
      m.total() / GiB, t.compute_s, t.tp_comm_s, t.cp_comm_s, t.pp_comm_s, t.dp_comm_s, 100 * t.bubble_fraction,
      t.step_s, t.tflops_per_device);
}

const char* kHeader =
    "   #  tp  cp  pp vpp   dp  mb recompute dist | weight  grads  optim  activ   total | compute tp comm cp comm pp comm "
    "dp comm bubble | step (s)  TFLOP/s\n"
    "                                             |         memory per device, GiB       |      time per step, s      "
    "                       |";

nlohmann::ordered_json entry_json(const PlanEntry& e) {
  const LayoutSpec& l = e.layout;
  const MemoryEstimate& m = e.memory;
  const TimeEstimate& t = e.time;
  return {{"tp", l.tp},
          {"cp", l.cp},
          {"pp", l.pp},
          {"vpp", l.vpp},
          {"dp", l.dp},
          {"micro_batch", l.micro_batch},
          {"recompute", recompute_name(l.recompute)},
          {"distributed_optimizer", l.distributed_optimizer},
          {"sequence_parallel", l.sequence_parallel},
          {"overlap", l.overlaps.str()},
          {"tflops_per_gpu", t.tflops_per_device},
          {"step_time_s", t.step_s},
          {"memory_bytes", m.total()},
          {"fits", e.fits},
          {"memory",
           {{"weights", m.weights},
            {"grads", m.grads},
            {"optimizer", m.optimizer},
            {"activations", m.activations},
            {"checkpoint_host", m.checkpoint_host},
            {"pipeline_stage", m.pp_rank}}},
          {"time",
           {{"compute_s", t.compute_s},
            {"tp_comm_s", t.tp_comm_s},
            {"pp_comm_s", t.pp_comm_s},
            {"dp_comm_s", t.dp_comm_s},
            {"optimizer_s", t.optimizer_s},
            {"bubble_s", t.bubble_s},
            {"bubble_fraction", t.bubble_fraction},
            {"tp_comm_hidden_s", t.tp_comm_hidden_s},
            {"pp_comm_hidden_s", t.pp_comm_hidden_s},
            {"dp_comm_hidden_s", t.dp_comm_hidden_s},
            {"cp_comm_s", t.cp_comm_s},
            {"cp_comm_hidden_s", t.cp_comm_hidden_s}}}};
}

DType dtype_of(const Config& cfg) {
  const std::string& d = cfg.precision.dtype;
  return d == "bf16" ? DType::BF16 : d == "fp16" ? DType::F16 : DType::F32;
}

PlanOptions options_from(const Config& cfg, int devices, int devices_per_node) {
  PlanOptions o;
  o.devices = devices;
  o.devices_per_node = devices_per_node;
  o.sequence_parallel = cfg.parallel.sequence_parallel;
  o.max_context = static_cast<int>(std::max<int64_t>(1, cfg.parallel.context));
  o.dtype = dtype_of(cfg);
  // what the trainer itself overlaps on this backend with this config
  o.overlaps = gpt_train_overlaps(cfg.backend, cfg.parallel.tp_comm_overlap);
  o.checkpoint_snapshot = cfg.checkpoint.async_save && !cfg.checkpoint.dir.empty();
  o.snapshot_optimizer_state = cfg.checkpoint.save_optimizer;
  return o;
}

// The config's own layout on `devices`, when it describes one that runs there.
std::optional<LayoutSpec> configured_layout(const Config& cfg, int devices) {
  try {
    GridLayout grid = grid_layout_from_config(cfg.parallel, devices);
    LayoutSpec l = layout_spec_from_config(cfg, grid);
    validate_layout(model_description_from_config(cfg), l);
    return l;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool same_layout(const LayoutSpec& a, const LayoutSpec& b) {
  return a.tp == b.tp && a.cp == b.cp && a.pp == b.pp && a.vpp == b.vpp && a.dp == b.dp && a.micro_batch == b.micro_batch &&
         a.recompute == b.recompute && a.distributed_optimizer == b.distributed_optimizer;
}

// The variant choices that differ from the GPT layout: "; rope, RMSNorm, SwiGLU, 8 query groups, untied
// output layer, no linear biases" (empty for GPT).
std::string variant_summary(const ModelDescription& m) {
  std::vector<std::string> parts;
  if (m.position != PositionEmbedding::LearnedAbsolute) parts.push_back(position_embedding_name(m.position));
  if (m.normalization != Normalization::LayerNorm) parts.push_back(normalization_name(m.normalization));
  if (m.swiglu) parts.push_back("SwiGLU");
  if (m.query_groups() != m.heads) parts.push_back(fmt::format("{} query groups", m.query_groups()));
  if (m.untie_embeddings) parts.push_back("untied output layer");
  if (!m.add_bias_linear) parts.push_back("no linear biases");
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "; " : ", ") + p;
  return out;
}

void print_plan(const Plan& plan, const Config& cfg, const ModelDescription& m, int top) {
  const HardwareSpec& hw = plan.hardware;
  int64_t params = 0;
  for (int64_t n : chunk_parameter_counts(m, LayoutSpec{}, 0)) params += n;
  int fitting = 0;
  for (const PlanEntry& e : plan.layouts) fitting += e.fits;
  std::cout << fmt::format(
      "model: {:.3f}B parameters ({} layers, hidden {}, {} heads, ffn {}, seq {}, vocab {}{}), global batch {}, {}\n",
      params / 1e9, m.num_layers, m.hidden, m.heads, m.ffn, m.seq_length, m.vocab_size, variant_summary(m),
      cfg.training.global_batch_size,
      cfg.precision.dtype);
  std::cout << fmt::format("hardware: {} ({}); {} devices, {} per node, {:.1f} GiB usable per device\n", hw.name,
                           hw.description, plan.options.devices, hw.devices_per_node, hw.usable_memory_bytes() / GiB);
  std::cout << fmt::format("overlap of communication with compute: {} (each layout gets the members that apply to it; "
                           "communication columns are the exposed part)\n",
                           plan.options.overlaps.str());
  std::cout << fmt::format("{} layouts evaluated: {} fit in memory, {} do not; {} choices break a rule\n\n",
                           plan.layouts.size(), fitting, plan.layouts.size() - fitting, plan.rejected.size());
  if (fitting == 0) {
    std::cout << "no layout fits in memory on this hardware\n";
  } else {
    std::cout << kHeader << "\n";
    for (int i = 0; i < std::min(top, fitting); ++i) std::cout << row(i + 1, plan.layouts[i]) << "\n";
  }
  if (auto mine = configured_layout(cfg, plan.options.devices)) {
    for (size_t i = 0; i < plan.layouts.size(); ++i) {
      if (!same_layout(plan.layouts[i].layout, *mine)) continue;
      const PlanEntry& e = plan.layouts[i];
      std::cout << "\nconfigured layout " << e.layout.str() << ":\n" << row(e.fits ? int(i) + 1 : 0, e) << "\n";
      if (!e.fits)
        std::cout << fmt::format("  does not fit: {:.2f} GiB > {:.2f} GiB usable\n", e.memory.total() / GiB,
                                 hw.usable_memory_bytes() / GiB);
      else if (plan.best())
        std::cout << fmt::format("  predicted {} slower than the best\n",
                                 pct(e.time.step_s / plan.best()->time.step_s - 1));
    }
  }
  // Each (tp, pp, dp) none of whose variants fits: its smallest footprint.
  std::map<std::tuple<int, int, int>, const PlanEntry*> smallest;
  std::set<std::tuple<int, int, int>> fits;
  for (const PlanEntry& e : plan.layouts) {
    auto key = std::make_tuple(e.layout.tp, e.layout.pp, e.layout.dp);
    if (e.fits) fits.insert(key);
    auto& s = smallest[key];
    if (!s || e.memory.total() < s->memory.total()) s = &e;
  }
  bool header = false;
  for (const auto& [key, e] : smallest) {
    if (fits.count(key)) continue;
    if (!header) std::cout << "\ndo not fit in memory (smallest variant of each tensor x pipeline x data):\n";
    header = true;
    std::cout << fmt::format("  tp {} pp {} dp {}: {:.2f} GiB > {:.2f} GiB usable, even with {}\n", e->layout.tp,
                             e->layout.pp, e->layout.dp, e->memory.total() / GiB, hw.usable_memory_bytes() / GiB,
                             e->layout.str());
  }
  if (!plan.rejected.empty()) std::cout << "\nbreak a rule:\n";
  for (const RejectedLayout& r : plan.rejected) {
    std::string what = "tp " + std::to_string(r.tp);
    if (r.pp) what += " pp " + std::to_string(r.pp) + " dp " + std::to_string(r.dp);
    std::cout << "  " << what << ": " << r.reason << "\n";
  }
}

// One JSON document on one line; numbers that are not finite are written as null.
void print_json(const Plan& plan, const ModelDescription& m, int64_t global_batch) {
  nlohmann::ordered_json out;
  out["hardware"] = plan.hardware.name;
  out["devices"] = plan.options.devices;
  out["devices_per_node"] = plan.hardware.devices_per_node;
  out["usable_memory_bytes"] = std::llround(plan.hardware.usable_memory_bytes());
  out["model"] = {{"num_layers", m.num_layers}, {"hidden_size", m.hidden},     {"num_heads", m.heads},
                  {"ffn_hidden_size", m.ffn},   {"seq_length", m.seq_length}, {"vocab_size", m.vocab_size},
                  {"position_embedding_type", position_embedding_name(m.position)},
                  {"normalization", normalization_name(m.normalization)},
                  {"swiglu", m.swiglu},
                  {"num_query_groups", m.query_groups()},
                  {"untie_embeddings_and_output_weights", m.untie_embeddings},
                  {"add_bias_linear", m.add_bias_linear},
                  {"global_batch_size", global_batch}};
  out["layouts"] = nlohmann::ordered_json::array();
  for (const PlanEntry& e : plan.layouts) out["layouts"].push_back(entry_json(e));
  out["rejected"] = nlohmann::ordered_json::array();
  for (const RejectedLayout& r : plan.rejected)
    out["rejected"].push_back({{"tp", r.tp}, {"pp", r.pp}, {"dp", r.dp}, {"reason", r.reason}});
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace

// ---- hardware files ----

HardwareSpec hardware_from_yaml(const std::string& yaml, const std::string& source) {
  auto fail = [&](const std::string& what) { throw std::runtime_error("hardware file " + source + ": " + what); };
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    fail(std::string("not valid YAML: ") + e.what());
  }
  if (!root.IsMap()) fail("expected a mapping of keys to values");
  HardwareSpec hw;
  hw.name = source;
  std::set<std::string> seen;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (key == "matmul_efficiency")
      fail("key 'matmul_efficiency' was replaced by the table 'gemm_efficiency' (" + std::string(kGemmTableHelp) +
           "; copy one from configs/hardware/, or rerun 'gpt-train plan --probe FILE' for a CPU)");
    if (key == "gemm_efficiency") {
      seen.insert(key);
      hw.gemm_efficiency = gemm_table_from_yaml(kv.second, fail);
      continue;
    }
    if (!kv.second.IsScalar()) fail("key '" + key + "' needs a single value");
    const std::string text = kv.second.as<std::string>();
    seen.insert(key);
    if (key == "name") {
      hw.name = text;
    } else if (key == "description") {
      hw.description = text;
    } else if (key == "devices_per_node") {
      try {
        size_t used = 0;
        hw.devices_per_node = std::stoi(text, &used);
        if (used != text.size()) throw std::invalid_argument(text);
      } catch (const std::exception&) {
        fail("devices_per_node must be an integer, got '" + text + "'");
      }
    } else {
      const HardwareField* f = nullptr;
      for (const HardwareField& c : hardware_fields())
        if (key == c.key) f = &c;
      if (!f) {
        std::string known = "name, description, devices_per_node, gemm_efficiency";
        for (const HardwareField& c : hardware_fields()) known += std::string(", ") + c.key;
        fail("unknown key '" + key + "' (known: " + known + ")");
      }
      try {
        size_t used = 0;
        hw.*(f->field) = std::stod(text, &used);
        if (used != text.size()) throw std::invalid_argument(text);
      } catch (const std::exception&) {
        fail("key '" + key + "' must be a number, got '" + text + "'");
      }
    }
  }
  for (const char* required : {"peak_tflops_16bit", "peak_tflops_fp32", "memory_gib", "memory_bandwidth_gbs",
                               "devices_per_node", "intra_node_bandwidth_gbs", "inter_node_bandwidth_gbs"})
    if (!seen.count(required)) fail(std::string("missing key '") + required + "'");
  if (!seen.count("gemm_efficiency"))
    fail("missing key 'gemm_efficiency' (" + std::string(kGemmTableHelp) +
         "; copy one from configs/hardware/, or rerun 'gpt-train plan --probe FILE' for a CPU)");
  try {
    hw.validate();
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  return hw;
}

HardwareSpec load_hardware(const std::string& name_or_file) {
  if (const HardwareSpec* hw = builtin_hardware(name_or_file)) return *hw;
  std::ifstream in(name_or_file);
  if (!in) {
    std::string names;
    for (const std::string& n : builtin_hardware_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::runtime_error("--hardware '" + name_or_file + "': neither a built-in description (" + names +
                             ") nor a readable file");
  }
  std::stringstream text;
  text << in.rdbuf();
  return hardware_from_yaml(text.str(), name_or_file);
}

std::string hardware_to_yaml(const HardwareSpec& hw) {
  // Names in double quotes with JSON escapes, which YAML reads back as the same string.
  auto quoted = [](const std::string& text) {
    return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::string out = fmt::format("name: {}\ndescription: {}\ndevices_per_node: {}\n", quoted(hw.name),
                                quoted(hw.description), hw.devices_per_node);
  for (const HardwareField& f : hardware_fields())
    out += fmt::format("{}: {:.6g}  # {}\n", f.key, hw.*(f.field), f.help);
  out += fmt::format("gemm_efficiency:  # {}\n", kGemmTableHelp);
  for (const GemmShapeEfficiency& e : hw.gemm_efficiency.entries())
    out += fmt::format("  - [{:.0f}, {:.0f}, {:.0f}, {:.4g}]\n", e.m, e.n, e.k, e.efficiency);
  return out;
}

// ---- start-up checks ----

std::vector<std::string> layout_check_warnings(const Config& cfg, const GridLayout& grid, const HardwareSpec& hw,
                                               int ranks_per_node, std::string* info) {
  const ModelDescription m = model_description_from_config(cfg);
  LayoutSpec mine = layout_spec_from_config(cfg, grid);
  PlanOptions o = options_from(cfg, grid.world(), ranks_per_node);
  mine.overlaps = applicable_overlaps(o.overlaps, mine);
  Plan plan = make_plan(m, cfg.training.global_batch_size, hw, o);
  PlanEntry chosen = evaluate_layout(m, mine, plan.hardware);
  std::vector<std::string> warnings;
  if (!chosen.fits)
    warnings.push_back(fmt::format("layout check ({}): {} is predicted to need {} per device, more than the {} usable",
                                   plan.hardware.name, mine.str(), format_bytes(chosen.memory.total()),
                                   format_bytes(static_cast<int64_t>(plan.hardware.usable_memory_bytes()))));
  const PlanEntry* best = plan.best();
  if (!best) return warnings;
  const double slower = chosen.time.step_s / best->time.step_s - 1;
  if (slower > 0.25)
    warnings.push_back(fmt::format("layout check ({}): {} is predicted {} slower than {} ({} vs {} per "
                                   "step); see 'gpt-train plan --config {} --gpus {} --hardware {}'",
                                   plan.hardware.name, mine.str(), pct(slower), best->layout.str(),
                                   seconds(chosen.time.step_s), seconds(best->time.step_s), cfg.source, grid.world(),
                                   // the value the user gave (a file path or a built-in name), so the command works
                                   cfg.logging.hardware.empty() ? hw.name : cfg.logging.hardware));
  if (info)
    *info = fmt::format("layout check ({}): predicted {} per step, {:.3g} TFLOP/s per device; the best layout "
                        "found ({}) is predicted {}",
                        plan.hardware.name, seconds(chosen.time.step_s), chosen.time.tflops_per_device,
                        best->layout.str(), seconds(best->time.step_s));
  return warnings;
}

namespace {

void layout_checks(const Config& cfg, const GridLayout& grid, int ranks_per_node) {
  spdlog::info("{}", format_memory_estimate(model_description_from_config(cfg), layout_spec_from_config(cfg, grid)));
  std::string hw_name = cfg.logging.hardware;
  if (hw_name.empty()) {
    if (cfg.backend != "cuda") {
      spdlog::info("layout check skipped: no hardware description for the cpu backend (set logging.hardware to a "
                   "file written by 'gpt-train plan --probe FILE')");
      return;
    }
    hw_name = "h100-80g";
  }
  std::string info;
  auto warnings = layout_check_warnings(cfg, grid, load_hardware(hw_name), ranks_per_node, &info);
  for (const std::string& w : warnings) spdlog::warn("{}", w);
  if (warnings.empty() && !info.empty()) spdlog::info("{}", info);
}

}  // namespace

void log_layout_checks(const Config& cfg, const GridLayout& grid, int ranks_per_node) {
  // Only the logging rank runs this, so nothing here may stop the job: a bad hardware file is a warning.
  try {
    layout_checks(cfg, grid, ranks_per_node);
  } catch (const std::exception& e) {
    spdlog::warn("layout check skipped: {}", e.what());
  }
}

// ---- the subcommand ----

int plan_main(const PlanCommandOptions& args) {
  try {
    if (!args.probe.empty()) {
      const int threads = static_cast<int>(args.threads.value_or(omp_get_max_threads()));
      const int per_node = static_cast<int>(args.gpus_per_node.value_or(1));
      HardwareSpec hw = probe_cpu(threads, per_node);
      std::ofstream f(args.probe);
      f << "# Written by 'gpt-train plan --probe': this machine's CPU backend as a planner hardware description.\n"
        << hardware_to_yaml(hw);
      if (!f) throw std::runtime_error("cannot write " + args.probe);
      std::cout << hardware_to_yaml(hw);
      return 0;
    }
    Config cfg = load_config(args.config, args.sets);
    const int gpus = static_cast<int>(args.gpus.value_or(1));
    HardwareSpec hw = load_hardware(args.hardware);
    PlanOptions o = options_from(cfg, gpus, static_cast<int>(args.gpus_per_node.value_or(0)));
    if (args.recompute != "all") o.recompute = parse_recompute(args.recompute);
    if (args.max_context) {
      if (*args.max_context < 1 || *args.max_context > 64)
        throw std::invalid_argument("--max-context " + std::to_string(*args.max_context) + " must be 1..64");
      o.max_context = static_cast<int>(*args.max_context);
    }
    if (args.distributed_optimizer != "all") o.distributed_optimizer = args.distributed_optimizer == "on";
    if (args.p2p_buffers == "freed") o.send_buffers = SendBuffers::FreedOnDelivery;
    o.grads_in_compute_dtype = args.grad_dtype == "compute";
    o.p2p_scatter_gather = args.p2p_scatter_gather == "on";
    o.materialized_attention = args.attention == "materialized";
    o.unfused_cross_entropy = args.loss == "unfused";
    o.regather_sp_inputs = args.sp_inputs == "regathered";
    o.overlaps = parse_overlaps(args.overlap, cfg.backend, cfg.parallel.tp_comm_overlap);
    const ModelDescription m = model_description_from_config(cfg);
    Plan plan = make_plan(m, cfg.training.global_batch_size, hw, o);
    if (!args.explain.empty()) {
      std::cout << explain_layout(plan, m, parse_layout_choice(args.explain));
      return 0;
    }
    if (args.json)
      print_json(plan, m, cfg.training.global_batch_size);
    else
      print_plan(plan, cfg, m, static_cast<int>(args.top));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt-train plan: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace gpt
