// Which communicator carries each process group's traffic for a given compute backend. The process grid
// (parallel/grid/process_grid.h) builds MPI groups, which move host memory; with the CUDA backend the groups
// that move tensors (tp, dp, pp, embedding) must move GPU memory instead, so they are rebuilt over the
// same ranks as NCCL communicators (the pipeline group with per-pair p2p channels), and groups of one
// become a device-aware identity. world and model_parallel only reduce host arrays and stay on MPI.
#pragma once
#include <string>

#include "model/ops/backend.h"
#include "parallel/grid/process_grid.h"

namespace gpt {

// True when this binary was built with NCCL (multi-GPU runs need it).
bool nccl_built_in();

// Makes `state` fit `backend`: nothing changes for a host backend; for a GPU backend the tp, dp, pp and
// embedding groups of several ranks are replaced by `communicator` (parallel.communicator):
//  - "nccl": NCCL communicators (one GPU per rank); std::runtime_error naming the group when NCCL is not
//    built in;
//  - "mpi": the MPI groups through host memory (parallel/comm/staged_communicator.h), for several ranks on one
//    GPU;
//  - "auto": NCCL when built in, else "mpi" with one warning.
// Collective over the world when any group has more than one rank: every rank must call it at the same
// point, after creating its backend.
void use_device_communicators(ParallelState& state, Backend& backend, const std::string& communicator = "auto");

// Wraps every group of several ranks (tp, dp, pp, embedding) so that it moves `backend`'s tensors through
// host memory over its MPI group: what "mpi" does for a GPU backend. On a host backend it runs the same
// staging code over host memory (the tests' way to check it without a GPU).
void use_host_staged_communicators(ParallelState& state, Backend& backend);

// mpi_parallel_state(layout) followed by use_device_communicators.
ParallelState make_parallel_state(const GridLayout& layout, Backend& backend, const std::string& communicator = "auto");

}  // namespace gpt
