// The launch environment: which rank this process is, how many there are, and where they run, as told by
// the launcher (OpenMPI's mpirun, Slurm's srun, MPICH/Hydra, or none for a plain single process), then
// cross-checked against MPI once it is up. Also the human description of the process grid printed at
// start-up: every tp/dp/pp/embedding group with its global ranks and hosts, plus warnings for layouts that
// will be slow (a tensor-parallel group spread over several hosts). The parsing and the description are pure
// functions of their inputs (an environment map, a host list) so they are tested without MPI.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <mpi.h>

#include "parallel/grid/process_grid.h"

namespace gpt {

enum class Launcher { None, OpenMPI, Slurm, Hydra };
const char* launcher_name(Launcher l);  // "none", "OpenMPI", "Slurm", "MPICH/Hydra"

struct LaunchEnv {
  Launcher launcher = Launcher::None;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // index among the ranks on this host
  int local_size = 1;
  int node_rank = 0;   // index of this host among the job's hosts (-1 when the launcher does not say)
  std::string host;
  // The variables the values came from, for messages ("OMPI_COMM_WORLD_RANK=3, ...").
  std::string source;
};

// Thrown when the environment is contradictory or malformed; the message names the variable.
struct LaunchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads the launch variables from `env`. Launchers are tried in this order, because an mpirun started
// inside a Slurm allocation inherits the batch shell's SLURM_* variables: OpenMPI (OMPI_COMM_WORLD_*),
// MPICH/Hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS), Slurm (SLURM_PROCID or PMIX_RANK,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE with SLURM_NODEID,
// SLURMD_NODENAME), none (rank 0 of 1). `hostname` is used when the launcher names no host.
LaunchEnv parse_launch_env(const std::map<std::string, std::string>& env, const std::string& hostname);
// The same from this process's environment and gethostname().
LaunchEnv discover_launch_env();
// This machine's host name.
std::string local_hostname();

// Slurm's compressed tasks-per-node list ("2(x3),1") expanded to one count per node.
std::vector<int> expand_slurm_tasks_per_node(const std::string& value);

// Collective over `world`: checks that MPI agrees with the launcher on rank and size, gathers every rank's
// host name and fills in what the launcher did not say (everything, for Launcher::None under an unknown
// launcher; local rank/size and node rank from the host list otherwise when missing). When any rank finds a
// disagreement every rank throws LaunchError, so no rank is left waiting.
struct LaunchInfo {
  LaunchEnv env;
  std::vector<std::string> hosts;  // host of each world rank
};
LaunchInfo reconcile_with_mpi(const LaunchEnv& env, MPI_Comm world = MPI_COMM_WORLD);

// Collective: every rank's host name, indexed by rank in `comm`.
std::vector<std::string> gather_hostnames(const std::string& host, MPI_Comm comm);

// Warnings for a layout on these hosts: tensor parallelism wider than a node, tensor-parallel groups that
// span hosts. hosts[r] is world rank r's host.
std::vector<std::string> layout_warnings(const GridLayout& layout, const std::vector<std::string>& hosts);
// A readable multi-line description: the grid, then each tp/dp/pp/embedding group with its global ranks
// and their hosts, then the warnings.
std::string describe_layout(const GridLayout& layout, const std::vector<std::string>& hosts);

}  // namespace gpt
