// Communication that runs beside compute, as the time model sees it: which overlaps a layout assumes and
// which of them can apply to it. Four are modelled, each a separate choice:
//  - tp: tensor-parallel all-gathers and reduce-scatters pipelined with the GEMM next to them
//    (Megatron-Core's --tp-comm-overlap through Transformer Engine; needs sequence parallelism);
//  - grad-reduce: the data-parallel gradient reduction (all-reduce, or the distributed optimizer's
//    reduce-scatter) launched bucket by bucket after each chunk's last microbatch backward
//    (Megatron's --overlap-grad-reduce);
//  - param-gather: the distributed optimizer's parameter all-gather overlapped with the forwards before
//    each chunk's first (Megatron's --overlap-param-gather; needs the distributed optimizer);
//  - p2p: pipeline sends and receives overlapped with the neighbouring chunk's compute (Megatron's
//    default for the interleaved schedule only).
// Named sets: "none"; "gpt-train", what this codebase does on a backend (cpu: none; cuda: grad-reduce);
// "megatron-core", all four (Megatron-LM's H100 benchmark runs), its tp overlap on Transformer Engine's
// userbuffers ("tp-userbuffers"). The hiding rule itself is in parallel/plan/time_model.cpp: an
// overlapped transfer costs max(0, transfer - compute it runs under) plus the slowdown of that compute.
#pragma once
#include <string>
#include <vector>

namespace gpt {

struct LayoutSpec;

struct Overlaps {
  bool tp = false;
  bool grad_reduce = false;
  bool param_gather = false;
  bool p2p = false;
  // The tp overlap runs on Transformer Engine's userbuffer kernels (the megatron-core set): its ring
  // exchanges on the copy engines with 1 SM, its pipelined and bulk transfers on 16 SMs the GEMM gives up
  // (transformer_engine/pytorch/module/base.py, initialize_ub's defaults: num_sm, use_ce,
  // set_sm_margin). Otherwise the transfers' kernels share the device as NCCL's do.
  bool tp_userbuffers = false;
  bool any() const { return tp || grad_reduce || param_gather || p2p; }
  bool operator==(const Overlaps& o) const {
    return tp == o.tp && grad_reduce == o.grad_reduce && param_gather == o.param_gather && p2p == o.p2p &&
           tp_userbuffers == o.tp_userbuffers;
  }
  // "none" or the members, comma-separated in a fixed order: "tp,grad-reduce,param-gather,p2p".
  std::string str() const;
};

// What gpt-train itself overlaps on a backend ("cpu" or "cuda"): nothing on the CPU; on CUDA the
// data-parallel gradient reduction, launched per bucket during the last microbatch's backward, and with
// `tp_comm_overlap` (parallel.tp_comm_overlap) the tensor-parallel collectives pipelined with the GEMMs.
Overlaps gpt_train_overlaps(const std::string& backend, bool tp_comm_overlap = false);
// Megatron-Core with --tp-comm-overlap --overlap-grad-reduce --overlap-param-gather and its default
// p2p overlap of the interleaved schedule; its tp overlap on Transformer Engine's userbuffers.
Overlaps megatron_core_overlaps();

// Parses the value of `plan --overlap`: none, gpt-train (for `backend` and `tp_comm_overlap`), megatron-core, or a
// comma-separated list of tp, grad-reduce, param-gather, p2p. Throws std::invalid_argument naming the
// flag and the accepted names.
Overlaps parse_overlaps(const std::string& text, const std::string& backend, bool tp_comm_overlap = false);

// Rejects a set that can apply to no layout of the search: tp overlap without sequence parallelism
// (Megatron-Core asserts the same), param-gather without the distributed optimizer or without
// grad-reduce (Megatron requires both). Throws std::invalid_argument naming the flag and the key.
void check_overlaps_for_search(const Overlaps& wanted, bool sequence_parallel, bool distributed_optimizer_allowed);

// The members of `wanted` that apply to this layout: tp needs tp > 1 and sequence parallelism,
// grad-reduce dp > 1, param-gather the distributed optimizer with dp > 1, p2p the interleaved schedule
// (pp > 1, vpp > 1). `why_not`, when given, receives one line per member left out.
Overlaps applicable_overlaps(const Overlaps& wanted, const LayoutSpec& layout,
                             std::vector<std::string>* why_not = nullptr);

}  // namespace gpt
