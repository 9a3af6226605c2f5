// Overlap sets of the time model (see overlap.h): names, presets, parsing and the rules for which
// overlap applies to which layout.
#include "parallel/plan/overlap.h"

#include <sstream>
#include <stdexcept>

#include "parallel/plan/memory_model.h"

namespace gpt {

namespace {

const char* kFlag = "--overlap";
const char* kNames = "none, gpt-train, megatron-core, or a comma-separated list of tp (or tp-userbuffers), grad-reduce, param-gather, p2p";

}  // namespace

std::string Overlaps::str() const {
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!out.empty()) out += ',';
    out += name;
  };
  add(tp, tp_userbuffers ? "tp-userbuffers" : "tp");
  add(grad_reduce, "grad-reduce");
  add(param_gather, "param-gather");
  add(p2p, "p2p");
  return out.empty() ? "none" : out;
}

Overlaps gpt_train_overlaps(const std::string& backend, bool tp_comm_overlap) {
  Overlaps o;
  // The trainer starts each gradient bucket's reduction during the last microbatch's backward as soon as
  // the bucket is complete (parallel.overlap_grad_reduce, parallel/data_parallel/grad_buckets.h). On CUDA it runs on the
  // NCCL communicator's own stream beside the backward kernels: that is the set assumed here. On the CPU
  // MPI's non-blocking collectives advance only inside MPI calls (the bucket reducer tests them as later
  // buckets start), so a CPU run is taken to hide nothing.
  o.grad_reduce = backend == "cuda";
  // parallel.tp_comm_overlap sends its row blocks on NCCL's per-peer streams beside the GEMMs on CUDA; on
  // the CPU the same exchanges advance only inside MPI calls, so they hide nothing there either.
  o.tp = backend == "cuda" && tp_comm_overlap;
  return o;
}

Overlaps megatron_core_overlaps() {
  Overlaps o;
  o.tp = o.grad_reduce = o.param_gather = o.p2p = true;
  o.tp_userbuffers = true;
  return o;
}

Overlaps parse_overlaps(const std::string& text, const std::string& backend, bool tp_comm_overlap) {
  if (text == "none") return Overlaps{};
  if (text == "gpt-train") return gpt_train_overlaps(backend, tp_comm_overlap);
  if (text == "megatron-core") return megatron_core_overlaps();
  Overlaps o;
  std::stringstream in(text);
  std::string name;
  int count = 0;
  while (std::getline(in, name, ',')) {
    ++count;
    if (name == "tp") o.tp = true;
    else if (name == "tp-userbuffers") o.tp = o.tp_userbuffers = true;
    else if (name == "grad-reduce") o.grad_reduce = true;
    else if (name == "param-gather") o.param_gather = true;
    else if (name == "p2p") o.p2p = true;
    else
      throw std::invalid_argument(std::string(kFlag) + ": unknown overlap '" + name + "' in '" + text +
                                  "' (expected " + kNames + ")");
  }
  if (count == 0) throw std::invalid_argument(std::string(kFlag) + ": empty (expected " + kNames + ")");
  return o;
}

void check_overlaps_for_search(const Overlaps& wanted, bool sequence_parallel, bool distributed_optimizer_allowed) {
  const std::string set = std::string(kFlag) + " " + wanted.str();
  if (wanted.tp && !sequence_parallel)
    throw std::invalid_argument(set + ": tensor-parallel overlap pipelines all-gathers and reduce-scatters with "
                                "GEMMs, which needs sequence parallelism (set parallel.sequence_parallel: true, "
                                "or leave tp out of the list)");
  if (wanted.param_gather && !distributed_optimizer_allowed)
    throw std::invalid_argument(set + ": the parameter all-gather exists only with the distributed optimizer, which "
                                "--distributed-optimizer off excludes");
  if (wanted.param_gather && !wanted.grad_reduce)
    throw std::invalid_argument(set + ": param-gather needs grad-reduce too (the parameters are gathered per "
                                "bucket of the gradient reduction, as in Megatron-Core)");
}

Overlaps applicable_overlaps(const Overlaps& wanted, const LayoutSpec& l, std::vector<std::string>* why_not) {
  Overlaps o = wanted;
  auto drop = [&](bool& member, const std::string& reason) {
    if (!member) return;
    member = false;
    if (why_not) why_not->push_back(reason);
  };
  if (l.tp == 1) drop(o.tp, "tp: not applicable (tensor 1 has no tensor-parallel communication)");
  else if (!l.sequence_parallel)
    drop(o.tp, "tp: not applicable (needs sequence parallelism: the all-reduces of plain tensor parallelism "
               "wait for the GEMM that produces their input)");
  if (l.grad_group() == 1) drop(o.grad_reduce, "grad-reduce: not applicable (data 1 has no gradient reduction)");
  if (l.grad_group() == 1) drop(o.param_gather, "param-gather: not applicable (data 1 has no parameter all-gather)");
  else if (!l.distributed_optimizer)
    drop(o.param_gather, "param-gather: not applicable (only the distributed optimizer all-gathers parameters)");
  o.tp_userbuffers = o.tp && wanted.tp_userbuffers;
  if (l.pp == 1) drop(o.p2p, "p2p: not applicable (pipeline 1 sends nothing)");
  else if (l.vpp == 1)
    drop(o.p2p, "p2p: not applicable (Megatron overlaps pipeline transfers only in the interleaved schedule, vpp > 1)");
  return o;
}

}  // namespace gpt
