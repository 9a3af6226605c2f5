// `plan --explain` (see plan_explain.h): finds the asked choice's variant in the plan and prints its
// cost lines beside the best layout's.
#include "app/plan_explain.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace gpt {

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

std::string choice_str(const LayoutChoice& c) {
  return c.cp > 1 ? fmt::format("{},{},{},{}", c.tp, c.pp, c.dp, c.cp) : fmt::format("{},{},{}", c.tp, c.pp, c.dp);
}

// Whether a breakdown line is one of the step's parts (they add up to the step time), not a subtotal or
// a hidden part.
bool is_step_part(const CostLine& c) {
  if (c.section == "compute") return c.label != "compute total";
  return c.label == "exposed" || c.label == "bubble" || c.section == "optimizer";
}

// The summary read first: how far the asked choice is from the best, and the three parts of the step
// that differ most between them.
std::string why_lines(const Plan& plan, const LayoutChoice& c, const PlanEntry& mine, const PlanEntry& best,
                      const std::vector<CostLine>& a, const std::vector<CostLine>& b) {
  int choices = 0;
  const int rank = choice_rank(plan, c.tp, c.pp, c.dp, c.cp, &choices);
  const double slower = mine.time.step_s / best.time.step_s - 1;
  const std::string where =
      rank ? fmt::format("rank {} of {} fitting choices", rank, choices) : std::string("it does not fit");
  if (rank == 1) return fmt::format("why: the asked choice is the best ({})\n", where);
  std::string out = fmt::format("why: the asked choice is predicted {:.1f}% {} than the best ({}); the parts of the "
                                "step that differ most, asked - best:\n",
                                100 * std::abs(slower), slower >= 0 ? "slower" : "faster", where);
  std::vector<size_t> parts;
  for (size_t i = 0; i < a.size(); ++i)
    if (is_step_part(a[i])) parts.push_back(i);
  std::stable_sort(parts.begin(), parts.end(), [&](size_t x, size_t y) {
    return std::abs(a[x].seconds - b[x].seconds) > std::abs(a[y].seconds - b[y].seconds);
  });
  for (size_t k = 0; k < parts.size() && k < 3; ++k) {
    const size_t i = parts[k];
    out += fmt::format("  {:+.4f} s  {}, {} ({:.4f} s against {:.4f} s)\n", a[i].seconds - b[i].seconds, a[i].section,
                       a[i].label, a[i].seconds, b[i].seconds);
  }
  return out;
}

std::string overlap_lines(const Plan& plan, const LayoutSpec& l) {
  std::vector<std::string> why_not;
  const Overlaps applied = applicable_overlaps(plan.options.overlaps, l, &why_not);
  std::string out = "    applied: " + applied.str() + "\n";
  for (const std::string& w : why_not) out += "    " + w + "\n";
  return out;
}

}  // namespace

LayoutChoice parse_layout_choice(const std::string& text) {
  LayoutChoice c;
  std::stringstream in(text);
  std::string part;
  std::vector<int> v;
  while (std::getline(in, part, ',')) {
    try {
      size_t used = 0;
      const int x = std::stoi(part, &used);
      if (used != part.size() || x < 1) throw std::invalid_argument(part);
      v.push_back(x);
    } catch (const std::exception&) {
      v.clear();
      break;
    }
  }
  if (v.size() != 3 && v.size() != 4)
    throw std::invalid_argument("--explain: expected TP,PP,DP or TP,PP,DP,CP (positive integers, e.g. 8,1,48), got '" +
                                text + "'");
  c.tp = v[0], c.pp = v[1], c.dp = v[2];
  if (v.size() == 4) c.cp = v[3];
  return c;
}

std::string explain_layout(const Plan& plan, const ModelDescription& m, const LayoutChoice& c) {
  const std::string asked = choice_str(c);
  if (c.tp * c.pp * c.dp * c.cp != plan.options.devices)
    throw std::invalid_argument(fmt::format("--explain {}: tensor x pipeline x data{} is {}, but the plan is for {} "
                                            "devices (--gpus)",
                                            asked, c.cp > 1 ? " x context" : "", c.tp * c.pp * c.dp * c.cp,
                                            plan.options.devices));
  if (c.cp > plan.options.max_context)
    throw std::invalid_argument(fmt::format("--explain {}: context {} is beyond the searched degrees (--max-context {})",
                                            asked, c.cp, plan.options.max_context));
  for (const RejectedLayout& r : plan.rejected)
    if (c.cp == 1 && r.tp == c.tp && (r.pp == 0 || (r.pp == c.pp && r.dp == c.dp)))
      throw std::invalid_argument("--explain " + asked + ": " + r.reason);
  const PlanEntry* mine = find_choice(plan, c.tp, c.pp, c.dp, c.cp);
  if (!mine)
    throw std::invalid_argument("--explain " + asked + ": no valid layout with these degrees (the global batch, "
                                "micro-batch and sequence-parallel rules leave none)");
  const PlanEntry* best = plan.best();
  const HardwareSpec& hw = plan.hardware;
  std::vector<CostLine> a, b;
  estimate_time(m, mine->layout, hw, &a);
  if (best) estimate_time(m, best->layout, hw, &b);

  std::string out;
  out += fmt::format("hardware {}; overlaps assumed: {}\n", hw.name, plan.options.overlaps.str());
  out += fmt::format("asked ({}): {}{}\n", asked, mine->layout.str(),
                     mine->fits ? "" : fmt::format("  -- does not fit: {:.2f} GiB > {:.2f} GiB usable",
                                                   mine->memory.total() / GiB, hw.usable_memory_bytes() / GiB));
  if (best)
    out += fmt::format("best:        {}\n", best->layout.str());
  else
    out += "best:        none fits in memory\n";
  if (best) out += why_lines(plan, c, *mine, *best, a, b);
  out += "\n";
  const int width = 36;
  out += fmt::format("{:<{}} {:>12} {:>12} {:>12}\n", "per step, seconds (slowest stage)", width, "asked", "best",
                     "asked-best");
  std::string section;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].section != section) {
      section = a[i].section;
      out += section + "\n";
    }
    const double bv = best ? b[i].seconds : 0;
    out += fmt::format("  {:<{}} {:>12.4f} {:>12} {:>12}\n", a[i].label, width - 2, a[i].seconds,
                       best ? fmt::format("{:.4f}", bv) : "-", best ? fmt::format("{:+.4f}", a[i].seconds - bv) : "-");
    if (!a[i].note.empty()) out += "      asked: " + a[i].note + "\n";
    if (best && !b[i].note.empty() && b[i].note != a[i].note) out += "      best:  " + b[i].note + "\n";
  }
  auto tflops = [](const PlanEntry& e) { return fmt::format("{:.1f}", e.time.tflops_per_device); };
  out += fmt::format("  {:<{}} {:>12} {:>12}\n", "TFLOP/s per device (Megatron's count)", width - 2, tflops(*mine),
                     best ? tflops(*best) : "-");
  out += "memory per device, GiB\n";
  const MemoryEstimate& ma = mine->memory;
  auto mem = [&](const char* label, int64_t x, int64_t y) {
    out += fmt::format("  {:<{}} {:>12.2f} {:>12}\n", label, width - 2, x / GiB, best ? fmt::format("{:.2f}", y / GiB) : "-");
  };
  const MemoryEstimate mb = best ? best->memory : MemoryEstimate{};
  mem("weights", ma.weights, mb.weights);
  mem("gradients", ma.grads, mb.grads);
  mem("optimizer state", ma.optimizer, mb.optimizer);
  mem("activations (peak)", ma.activations, mb.activations);
  mem("total", ma.total(), mb.total());
  out += fmt::format("  {:<{}} {:>12.2f}\n", "usable", width - 2, hw.usable_memory_bytes() / GiB);
  out += "overlaps, asked\n" + overlap_lines(plan, mine->layout);
  if (best) out += "overlaps, best\n" + overlap_lines(plan, best->layout);
  if (best)
    out += fmt::format("\nthe asked choice is predicted {:.1f}% slower than the best\n",
                       100 * (mine->time.step_s / best->time.step_s - 1));
  return out;
}

}  // namespace gpt
