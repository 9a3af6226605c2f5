// Rank discovery from launcher variables, reconciliation with MPI (every rank agrees or every rank throws),
// host-name gathering, and the start-up description and warnings for the process grid.
#include "app/launch_env.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstring>
#include <set>

#include "parallel/grid/context_parallel.h"

extern char** environ;

namespace gpt {

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::None: return "none";
    case Launcher::OpenMPI: return "OpenMPI";
    case Launcher::Slurm: return "Slurm";
    case Launcher::Hydra: return "MPICH/Hydra";
  }
  return "?";
}

namespace {

using Env = std::map<std::string, std::string>;

const std::string* lookup(const Env& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

int parse_count(const std::string& key, const std::string& value) {
  int v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || v < 0)
    throw LaunchError("environment variable " + key + "='" + value + "' is not a non-negative integer");
  return v;
}

// The first of `keys` that is set, parsed; `fallback` when none is. Records what it used in `source`.
int read_int(const Env& env, std::initializer_list<const char*> keys, int fallback, std::string& source) {
  for (const char* key : keys)
    if (const std::string* v = lookup(env, key)) {
      int value = parse_count(key, *v);
      source += (source.empty() ? "" : ", ") + std::string(key) + "=" + *v;
      return value;
    }
  return fallback;
}

void validate(const LaunchEnv& e) {
  std::string from = " (" + std::string(launcher_name(e.launcher)) + ": " + e.source + ")";
  if (e.world_size < 1) throw LaunchError("launch environment gives world size " + std::to_string(e.world_size) + from);
  if (e.rank >= e.world_size)
    throw LaunchError("launch environment gives rank " + std::to_string(e.rank) + " but world size " +
                      std::to_string(e.world_size) + from);
  if (e.local_size == 0 || e.local_size > e.world_size)
    throw LaunchError("launch environment gives local size " + std::to_string(e.local_size) + " for world size " +
                      std::to_string(e.world_size) + from);
  if (e.local_size > 0 && e.local_rank >= e.local_size)
    throw LaunchError("launch environment gives local rank " + std::to_string(e.local_rank) + " but local size " +
                      std::to_string(e.local_size) + from);
}

}  // namespace

std::vector<int> expand_slurm_tasks_per_node(const std::string& value) {
  // Comma-separated items "N" or "N(xK)" meaning K nodes of N tasks each.
  std::vector<int> out;
  auto bad = [&] { return LaunchError("cannot parse Slurm tasks-per-node list '" + value + "'"); };
  size_t pos = 0;
  while (pos < value.size()) {
    size_t comma = value.find(',', pos);
    std::string item = value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? value.size() : comma + 1;
    size_t paren = item.find('(');
    int tasks = 0, repeat = 1;
    try {
      tasks = parse_count("tasks-per-node", item.substr(0, paren));
      if (paren != std::string::npos) {
        if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') throw bad();
        repeat = parse_count("tasks-per-node", item.substr(paren + 2, item.size() - paren - 3));
      }
    } catch (const LaunchError&) {
      throw bad();
    }
    out.insert(out.end(), repeat, tasks);
  }
  if (out.empty()) throw bad();
  return out;
}

LaunchEnv parse_launch_env(const Env& env, const std::string& hostname) {
  LaunchEnv e;
  e.host = hostname;
  e.node_rank = -1;
  if (lookup(env, "OMPI_COMM_WORLD_RANK")) {
    e.launcher = Launcher::OpenMPI;
    e.rank = read_int(env, {"OMPI_COMM_WORLD_RANK"}, 0, e.source);
    e.world_size = read_int(env, {"OMPI_COMM_WORLD_SIZE"}, -1, e.source);
    if (e.world_size < 0) throw LaunchError("OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
    e.local_rank = read_int(env, {"OMPI_COMM_WORLD_LOCAL_RANK"}, -1, e.source);
    e.local_size = read_int(env, {"OMPI_COMM_WORLD_LOCAL_SIZE"}, -1, e.source);
  } else if (lookup(env, "PMI_RANK") && lookup(env, "PMI_SIZE")) {
    e.launcher = Launcher::Hydra;
    e.rank = read_int(env, {"PMI_RANK"}, 0, e.source);
    e.world_size = read_int(env, {"PMI_SIZE"}, 1, e.source);
    e.local_rank = read_int(env, {"MPI_LOCALRANKID"}, -1, e.source);
    e.local_size = read_int(env, {"MPI_LOCALNRANKS"}, -1, e.source);
  } else if (lookup(env, "SLURM_PROCID") || (lookup(env, "PMIX_RANK") && lookup(env, "SLURM_NTASKS"))) {
    e.launcher = Launcher::Slurm;
    e.rank = read_int(env, {"SLURM_PROCID", "PMIX_RANK"}, 0, e.source);
    if (lookup(env, "SLURM_PROCID") && lookup(env, "PMIX_RANK")) {
      std::string ignored;
      int pmix = read_int(env, {"PMIX_RANK"}, 0, ignored);
      if (pmix != e.rank)
        throw LaunchError("SLURM_PROCID=" + std::to_string(e.rank) + " and PMIX_RANK=" + std::to_string(pmix) +
                          " disagree");
    }
    e.world_size = read_int(env, {"SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"}, -1, e.source);
    if (e.world_size < 0) throw LaunchError("SLURM_PROCID is set but SLURM_NTASKS is not");
    e.local_rank = read_int(env, {"SLURM_LOCALID"}, -1, e.source);
    e.node_rank = read_int(env, {"SLURM_NODEID"}, -1, e.source);
    e.local_size = -1;
    for (const char* key : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
      if (const std::string* v = lookup(env, key)) {
        std::vector<int> per_node = expand_slurm_tasks_per_node(*v);
        int node = e.node_rank < 0 ? 0 : e.node_rank;
        if (per_node.size() == 1 || node < static_cast<int>(per_node.size())) {
          e.local_size = per_node.size() == 1 ? per_node[0] : per_node[node];
          e.source += std::string(", ") + key + "=" + *v;
        }
        break;
      }
    if (const std::string* node = lookup(env, "SLURMD_NODENAME"); node && !node->empty()) {
      e.host = *node;
      e.source += ", SLURMD_NODENAME=" + *node;
    }
  } else {
    e.launcher = Launcher::None;
    e.node_rank = 0;
    e.source = "no launcher variables";
  }
  validate(e);
  return e;
}

std::string local_hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

LaunchEnv discover_launch_env() {
  Env env;
  for (char** p = environ; p && *p; ++p) {
    const char* eq = std::strchr(*p, '=');
    if (!eq) continue;
    std::string key(*p, eq - *p);
    // Only the launcher families we read; the rest of the environment is of no interest here.
    if (key.rfind("OMPI_", 0) == 0 || key.rfind("SLURM", 0) == 0 || key.rfind("PMI", 0) == 0 ||
        key.rfind("MPI_LOCAL", 0) == 0)
      env.emplace(std::move(key), eq + 1);
  }
  return parse_launch_env(env, local_hostname());
}

std::vector<std::string> gather_hostnames(const std::string& host, MPI_Comm comm) {
  constexpr int kWidth = 256;  // longer names are cut; HOST_NAME_MAX is 64 on Linux
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<char> mine(kWidth, 0), all(static_cast<size_t>(kWidth) * size, 0);
  std::memcpy(mine.data(), host.data(), std::min<size_t>(host.size(), kWidth - 1));
  if (MPI_Allgather(mine.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, comm) != MPI_SUCCESS)
    throw LaunchError("MPI_Allgather of host names failed");
  std::vector<std::string> hosts(size);
  for (int r = 0; r < size; ++r) hosts[r] = std::string(all.data() + static_cast<size_t>(r) * kWidth);
  return hosts;
}

LaunchInfo reconcile_with_mpi(const LaunchEnv& env, MPI_Comm world) {
  int mpi_rank = 0, mpi_size = 1;
  MPI_Comm_rank(world, &mpi_rank);
  MPI_Comm_size(world, &mpi_size);
  std::string problem;
  if (env.launcher != Launcher::None && (env.rank != mpi_rank || env.world_size != mpi_size))
    problem = "the launcher (" + std::string(launcher_name(env.launcher)) + ": " + env.source + ") says rank " +
              std::to_string(env.rank) + " of " + std::to_string(env.world_size) + " but MPI says rank " +
              std::to_string(mpi_rank) + " of " + std::to_string(mpi_size) +
              "; was the program started by a different launcher than the one whose variables it inherited?";
  // Agree on the first rank with a problem and throw its message everywhere.
  int mine = problem.empty() ? INT_MAX : mpi_rank, first = INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, world);
  if (first != INT_MAX) {
    int len = static_cast<int>(problem.size());
    MPI_Bcast(&len, 1, MPI_INT, first, world);
    problem.resize(len);
    MPI_Bcast(problem.data(), len, MPI_CHAR, first, world);
    throw LaunchError("rank " + std::to_string(first) + ": " + problem);
  }

  LaunchInfo info;
  info.env = env;
  info.hosts = gather_hostnames(env.host, world);
  LaunchEnv& e = info.env;
  e.rank = mpi_rank;
  e.world_size = mpi_size;
  // Fill what the launcher did not say from the host list: ranks on the same host are "local".
  int local_rank = 0, local_size = 0;
  for (int r = 0; r < mpi_size; ++r)
    if (info.hosts[r] == info.hosts[mpi_rank]) {
      if (r < mpi_rank) ++local_rank;
      ++local_size;
    }
  if (env.launcher == Launcher::None || e.local_rank < 0 || e.local_size < 0) {
    e.local_rank = local_rank;
    e.local_size = local_size;
  }
  if (env.launcher == Launcher::None || e.node_rank < 0) {
    std::vector<std::string> order;
    for (const auto& h : info.hosts)
      if (std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
    e.node_rank = static_cast<int>(std::find(order.begin(), order.end(), info.hosts[mpi_rank]) - order.begin());
  }
  return info;
}

// ---- layout description ----

namespace {

void require_hosts(const GridLayout& layout, const std::vector<std::string>& hosts) {
  if (static_cast<int>(hosts.size()) != layout.world())
    throw std::invalid_argument("layout description: " + std::to_string(hosts.size()) + " host names for " +
                                std::to_string(layout.world()) + " ranks");
}

std::vector<std::string> distinct_hosts(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  std::vector<std::string> out;
  for (int r : ranks)
    if (std::find(out.begin(), out.end(), hosts[r]) == out.end()) out.push_back(hosts[r]);
  return out;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// "ranks 0, 1 on a" when the group is on one host, else "ranks 0 (a), 4 (b)".
std::string ranks_with_hosts(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  auto where = distinct_hosts(ranks, hosts);
  std::vector<std::string> items;
  for (int r : ranks) items.push_back(std::to_string(r) + (where.size() == 1 ? "" : " (" + hosts[r] + ")"));
  std::string out = (ranks.size() == 1 ? "rank " : "ranks ") + join(items, ", ");
  if (where.size() == 1) out += " on " + where[0];
  return out;
}

// The coordinates a group's members share, e.g. "dp 0, pp 1" for a tensor-parallel group ("cp 1, dp 0,
// pp 1" with context parallelism).
std::string shared_coords(GroupKind kind, GridCoord c, bool context) {
  const std::string tp = "tp " + std::to_string(c.tp), dp = "dp " + std::to_string(c.dp),
                    pp = "pp " + std::to_string(c.pp), cp = context ? "cp " + std::to_string(c.cp) + ", " : "";
  switch (kind) {
    case GroupKind::Tensor: return cp + dp + ", " + pp;
    case GroupKind::Context: return tp + ", " + dp + ", " + pp;
    case GroupKind::Data: return tp + ", " + pp;
    case GroupKind::Pipeline:
    case GroupKind::Embedding: return tp + ", " + cp + dp;
    case GroupKind::ModelParallel: return cp + dp;
  }
  return {};
}

}  // namespace

std::vector<std::string> layout_warnings(const GridLayout& layout, const std::vector<std::string>& hosts) {
  require_hosts(layout, hosts);
  std::vector<std::string> out;
  if (!layout.warning().empty()) out.push_back(layout.warning());
  std::vector<std::string> spanning;
  int count = 0;
  auto groups = layout.all_groups(GroupKind::Tensor);
  for (size_t g = 0; g < groups.size(); ++g) {
    auto where = distinct_hosts(groups[g], hosts);
    if (where.size() < 2) continue;
    if (++count <= 3) spanning.push_back("group " + std::to_string(g) + " on " + join(where, ", "));
  }
  if (count)
    out.push_back(std::to_string(count) + " of " + std::to_string(groups.size()) +
                  " tensor-parallel groups span hosts (" + join(spanning, "; ") + (count > 3 ? "; ..." : "") +
                  "); tensor parallelism communicates in every layer, so keep each group on one host (launch "
                  "consecutive ranks on the same host, or lower parallel.tensor)");
  return out;
}

std::string describe_layout(const GridLayout& layout, const std::vector<std::string>& hosts) {
  require_hosts(layout, hosts);
  const bool context = layout.cp() > 1;
  const std::string order = context ? "tp + " + std::to_string(layout.tp()) + " * (cp + " +
                                          std::to_string(layout.cp()) + " * (dp + " + std::to_string(layout.dp()) +
                                          " * pp))"
                                    : "tp + " + std::to_string(layout.tp()) + " * (dp + " +
                                          std::to_string(layout.dp()) + " * pp)";
  std::string out = "process grid: " + layout.str() + " (rank = " + order + ") on " +
                    std::to_string(std::set<std::string>(hosts.begin(), hosts.end()).size()) +
                    " host(s)\n";
  const std::pair<GroupKind, const char*> kinds[] = {{GroupKind::Tensor, "tensor-parallel"},
                                                     {GroupKind::Context, "context-parallel"},
                                                     {GroupKind::Data, "data-parallel"},
                                                     {GroupKind::Pipeline, "pipeline"},
                                                     {GroupKind::Embedding, "embedding"}};
  for (auto [kind, title] : kinds) {
    if (kind == GroupKind::Context && !context) continue;
    auto groups = layout.all_groups(kind);
    out += std::string(title) + " groups (" + std::to_string(groups.size()) + " of " +
           std::to_string(layout.group_size(kind)) + "):\n";
    for (size_t g = 0; g < groups.size(); ++g)
      out += "  " + std::string(group_kind_name(kind)) + " group " + std::to_string(g) + " [" +
             shared_coords(kind, layout.coord_of(groups[g][0]), context) + "]: " + ranks_with_hosts(groups[g], hosts) + "\n";
  }
  if (context)
    out += "context chunks (each sequence in " + std::to_string(2 * layout.cp()) +
           ", context rank r holds chunks r and " + std::to_string(2 * layout.cp() - 1) +
           " - r): " + context_chunk_picture(layout.cp()) + "\n";
  for (const auto& w : layout_warnings(layout, hosts)) out += "warning: " + w + "\n";
  return out;
}

}  // namespace gpt
