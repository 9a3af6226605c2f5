// Single-process tests of the pure parts of the process grid and the launch environment: layout
// validation and its messages, rank <-> coordinate math, group memberships checked against Megatron's
// range-based group construction (an independent reference), MPI split colors and keys, embedding groups,
// launcher variable parsing (OpenMPI, Slurm, MPICH/Hydra, none), the layout description and warnings, and
// the MPI-free single-process ParallelState.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "app/config_model.h"
#include "app/config.h"
#include "app/launch_env.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/grid/process_grid.h"
#include "tests/host_tensor.h"

namespace gpt {
namespace {

using Groups = std::set<std::vector<int>>;

// Megatron-LM's initialize_model_parallel, written with its own ranges rather than with coordinates.
struct MegatronGroups {
  Groups tp, dp, pp, embedding, model_parallel;
};

MegatronGroups megatron_groups(int world, int tp, int pp) {
  MegatronGroups g;
  int dp = world / (tp * pp);
  for (int i = 0; i < world / tp; ++i) {
    std::vector<int> r;
    for (int k = i * tp; k < (i + 1) * tp; ++k) r.push_back(k);
    g.tp.insert(r);
  }
  int per_stage = world / pp;
  for (int i = 0; i < per_stage; ++i) {
    std::vector<int> r;
    for (int k = i; k < world; k += per_stage) r.push_back(k);
    g.pp.insert(r);
    g.embedding.insert(r.size() > 1 ? std::vector<int>{r.front(), r.back()} : std::vector<int>{r.front()});
  }
  for (int i = 0; i < pp; ++i) {
    int start = i * per_stage, end = (i + 1) * per_stage;
    for (int j = 0; j < tp; ++j) {
      std::vector<int> r;
      for (int k = start + j; k < end; k += tp) r.push_back(k);
      g.dp.insert(r);
    }
  }
  // Model-parallel group d: every rank whose data-parallel index is d, i.e. the d-th member of each dp group.
  for (int d = 0; d < dp; ++d) {
    std::vector<int> r;
    for (const auto& group : g.dp) r.push_back(group[d]);
    std::sort(r.begin(), r.end());
    g.model_parallel.insert(r);
  }
  return g;
}

Groups as_set(const std::vector<std::vector<int>>& v) { return Groups(v.begin(), v.end()); }

std::string grid_error(int world, int tp, int pp, int dp) {
  try {
    GridLayout(world, tp, pp, dp);
  } catch (const GridError& e) {
    return e.what();
  }
  return "no error";
}

std::string grid_error_cp(int world, int tp, int pp, int dp, int cp) {
  try {
    GridLayout(world, tp, pp, dp, cp);
  } catch (const GridError& e) {
    return e.what();
  }
  return "no error";
}

TEST(GridLayout, MegatronOrderCoordinates) {
  GridLayout g(16, 2, 2, 4);
  EXPECT_EQ(g.rank_of({1, 3, 1}), 1 + 2 * (3 + 4 * 1));
  for (int r = 0; r < 16; ++r) {
    GridCoord c = g.coord_of(r);
    EXPECT_EQ(r, c.tp + 2 * (c.dp + 4 * c.pp));
    EXPECT_EQ(g.rank_of(c), r);
  }
  EXPECT_EQ(g.coord_of(13), (GridCoord{1, 2, 1}));
}

TEST(GridLayout, GroupsMatchMegatronForManyLayouts) {
  int layouts = 0;
  for (int world = 1; world <= 48; ++world)
    for (int tp = 1; tp <= world; ++tp)
      for (int pp = 1; pp <= world / tp; ++pp) {
        if (world % (tp * pp)) continue;
        GridLayout g(world, tp, pp);  // dp derived
        ASSERT_EQ(g.dp() * tp * pp, world);
        MegatronGroups ref = megatron_groups(world, tp, pp);
        EXPECT_EQ(as_set(g.all_groups(GroupKind::Tensor)), ref.tp) << g.str();
        EXPECT_EQ(as_set(g.all_groups(GroupKind::Data)), ref.dp) << g.str();
        EXPECT_EQ(as_set(g.all_groups(GroupKind::Pipeline)), ref.pp) << g.str();
        EXPECT_EQ(as_set(g.all_groups(GroupKind::Embedding)), ref.embedding) << g.str();
        EXPECT_EQ(as_set(g.all_groups(GroupKind::ModelParallel)), ref.model_parallel) << g.str();
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(ref.tp.count(g.tp_group(r)));
          EXPECT_TRUE(ref.dp.count(g.dp_group(r)));
          EXPECT_TRUE(ref.pp.count(g.pp_group(r)));
          EXPECT_TRUE(ref.model_parallel.count(g.model_parallel_group(r)));
          // Each rank is a member of its own groups, at the index of its coordinate.
          GridCoord c = g.coord_of(r);
          EXPECT_EQ(g.tp_group(r)[c.tp], r);
          EXPECT_EQ(g.dp_group(r)[c.dp], r);
          EXPECT_EQ(g.pp_group(r)[c.pp], r);
        }
        ++layouts;
      }
  EXPECT_GT(layouts, 200);
}

// Megatron-Core's order with context parallelism, "tp-cp-dp-pp": rank = tp + TP * (cp + CP * (dp + DP * pp)).
// Its groups written with ranges: context groups of CP ranks TP apart inside each block of TP * CP ranks; the
// gradient (data x context) groups of CP * DP ranks TP apart inside each pipeline stage.
TEST(GridLayout, ContextGroupsMatchMegatronCore) {
  int layouts = 0;
  for (auto [world, tp, cp, pp] : {std::tuple{8, 1, 2, 1}, {8, 2, 2, 1}, {8, 1, 4, 1}, {8, 2, 2, 2}, {16, 2, 4, 1},
                                   {16, 1, 2, 2}, {24, 2, 3, 2}, {32, 2, 2, 2}}) {
    GridLayout g(world, tp, pp, 0, cp);
    const int dp = world / (tp * cp * pp);
    ASSERT_EQ(g.dp(), dp) << g.str();
    Groups ref_cp, ref_data, ref_tp;
    for (int s = 0; s < world; s += tp * cp)
      for (int j = 0; j < tp; ++j) {
        std::vector<int> r;
        for (int k = 0; k < cp; ++k) r.push_back(s + j + k * tp);
        ref_cp.insert(r);
      }
    for (int stage = 0; stage < pp; ++stage)
      for (int j = 0; j < tp; ++j) {
        std::vector<int> r;
        for (int k = 0; k < cp * dp; ++k) r.push_back(stage * (world / pp) + j + k * tp);
        ref_data.insert(r);
      }
    for (int s = 0; s < world; s += tp) {
      std::vector<int> r;
      for (int k = 0; k < tp; ++k) r.push_back(s + k);
      ref_tp.insert(r);
    }
    EXPECT_EQ(as_set(g.all_groups(GroupKind::Context)), ref_cp) << g.str();
    EXPECT_EQ(as_set(g.all_groups(GroupKind::Data)), ref_data) << g.str();
    EXPECT_EQ(as_set(g.all_groups(GroupKind::Tensor)), ref_tp) << g.str();
    EXPECT_EQ(as_set(g.all_groups(GroupKind::Pipeline)), megatron_groups(world, tp, pp).pp) << g.str();
    for (int r = 0; r < world; ++r) {
      const GridCoord c = g.coord_of(r);
      EXPECT_EQ(r, c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp))) << g.str();
      EXPECT_EQ(g.rank_of(c), r);
      EXPECT_EQ(g.members(GroupKind::Context, r)[c.cp], r);
      EXPECT_EQ(g.dp_group(r)[c.cp + cp * c.dp], r);  // the gradient group's rank: cp fastest
    }
    ++layouts;
  }
  EXPECT_EQ(layouts, 8);
  EXPECT_EQ(GridLayout(8, 2, 1, 2, 2).str(), "world 8 = tensor 2 x pipeline 1 x context 2 x data 2");
  EXPECT_EQ(grid_error_cp(8, 2, 1, 1, 2),
            "world size 8 does not equal tensor (2) x pipeline (1) x context (2) x data (1) = 4");
}

TEST(GridLayout, SplitColorsAndKeysReproduceMembers) {
  for (auto [world, tp, pp] : {std::tuple{8, 2, 2}, {8, 2, 1}, {8, 1, 4}, {8, 8, 1}, {8, 1, 8}, {24, 2, 3}, {12, 3, 4}}) {
    GridLayout g(world, tp, pp);
    for (GroupKind kind : {GroupKind::Tensor, GroupKind::Data, GroupKind::Pipeline, GroupKind::Embedding,
                           GroupKind::ModelParallel}) {
      // What MPI_Comm_split would build: group by color, order by key.
      std::map<int, std::vector<std::pair<int, int>>> by_color;
      for (int r = 0; r < world; ++r) {
        GroupSplit s = g.split_for(kind, r);
        EXPECT_EQ(s.color >= 0, g.in_group(kind, r));
        if (s.color >= 0) by_color[s.color].push_back({s.key, r});
      }
      EXPECT_EQ(static_cast<int>(by_color.size()), g.num_groups(kind)) << group_kind_name(kind) << " " << g.str();
      for (auto& [color, entries] : by_color) {
        std::sort(entries.begin(), entries.end());
        std::vector<int> ranks;
        for (auto [key, r] : entries) ranks.push_back(r);
        EXPECT_EQ(static_cast<int>(ranks.size()), g.group_size(kind));
        for (int r : ranks) EXPECT_EQ(g.members(kind, r), ranks) << group_kind_name(kind) << " " << g.str();
      }
    }
  }
}

TEST(GridLayout, EmbeddingGroups) {
  GridLayout flat(4, 2, 1, 2);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(flat.embedding_group(r), std::vector<int>{r});
    EXPECT_TRUE(flat.in_group(GroupKind::Embedding, r));
  }
  GridLayout deep(16, 2, 4, 2);  // stage size 4: stages hold ranks 0-3, 4-7, 8-11, 12-15
  EXPECT_EQ(deep.embedding_group(1), (std::vector<int>{1, 13}));
  EXPECT_EQ(deep.embedding_group(14), (std::vector<int>{2, 14}));
  EXPECT_EQ(deep.embedding_group(6), (std::vector<int>{2, 14}));  // rank 6's pipeline, though 6 is not in it
  EXPECT_FALSE(deep.in_group(GroupKind::Embedding, 6));
  EXPECT_EQ(deep.split_for(GroupKind::Embedding, 6).color, -1);
  EXPECT_TRUE(deep.in_group(GroupKind::Embedding, 12));
  GridLayout two(4, 1, 2, 2);
  EXPECT_EQ(two.embedding_group(3), (std::vector<int>{1, 3}));
}

TEST(GridLayout, ErrorMessages) {
  EXPECT_EQ(grid_error(6, 2, 2, 2), "world size 6 does not equal tensor (2) x pipeline (2) x data (2) = 8");
  EXPECT_EQ(grid_error(8, 3, 1, 3), "world size 8 does not equal tensor (3) x pipeline (1) x data (3) = 9");
  EXPECT_EQ(grid_error(8, 3, 1, 0),
            "world size 8 is not divisible by tensor (3) x pipeline (1) = 3, so the data-parallel size cannot be derived");
  EXPECT_EQ(grid_error(8, 0, 1, 0), "tensor-parallel size must be at least 1 (got 0)");
  EXPECT_EQ(grid_error(8, 2, -1, 0), "pipeline-parallel size must be at least 1 (got -1)");
  EXPECT_EQ(grid_error(8, 2, 1, -2), "data-parallel size must be at least 1, or 0 to derive it (got -2)");
  EXPECT_EQ(grid_error(0, 1, 1, 0), "world size must be at least 1 (got 0)");
  // Products that overflow int are still rejected, not wrapped.
  EXPECT_NE(grid_error(8, 65536, 65536, 2).find("does not equal"), std::string::npos);
  GridLayout g(8, 2, 2);
  EXPECT_THROW(g.coord_of(8), GridError);
  EXPECT_THROW(g.coord_of(-1), GridError);
  EXPECT_THROW(g.rank_of({2, 0, 0}), GridError);
  EXPECT_TRUE((std::is_base_of_v<std::invalid_argument, GridError>));
}

TEST(GridLayout, WideTensorParallelWarns) {
  EXPECT_EQ(GridLayout(16, 8, 1).warning(), "");
  EXPECT_NE(GridLayout(16, 16, 1).warning().find("tensor-parallel size 16"), std::string::npos);
}

TEST(GridLayout, FromConfig) {
  ParallelConfig p;
  p.tensor = 2;
  p.pipeline = 3;
  p.data = 0;
  GridLayout g = grid_layout_from_config(p, 12);
  EXPECT_EQ(g.dp(), 2);
  p.data = 3;
  EXPECT_THROW(grid_layout_from_config(p, 12), GridError);
  p.tensor = int64_t(1) << 40;
  EXPECT_THROW(grid_layout_from_config(p, 12), GridError);
}

TEST(GridParallelState, SingleProcessNeedsNoMpi) {
  ParallelState s = single_process_state();
  EXPECT_EQ(s.layout.world(), 1);
  for (Communicator* c : {s.world.get(), s.tp.get(), s.dp.get(), s.pp.get(), s.embedding.get(), s.model_parallel.get()}) {
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->size(), 1);
    EXPECT_EQ(c->rank(), 0);
  }
  EXPECT_EQ(s.tp->name(), "tp");
  EXPECT_TRUE(s.is_first_stage());
  EXPECT_TRUE(s.is_last_stage());
  double x[2] = {1.5, -2};
  s.dp->all_reduce_host(x, 2);
  EXPECT_EQ(x[0], 1.5);
}

// ---- batched exchange on a group of one ----

TEST(GridSelfExchange, SelfGroupMatchesByTag) {
  SelfCommunicator self("pp");
  Tensor a = host_tensor(3), b = host_tensor(3), ra = host_tensor(3), rb = host_tensor(3);
  for (int i = 0; i < 3; ++i) a.f32()[i] = i, b.f32()[i] = 10 + i;
  exchange(self, {P2POp::recv(rb, 0, 2), P2POp::send(a, 0, 1), P2POp::recv(ra, 0, 1), P2POp::send(b, 0, 2)});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ra.f32()[i], i);
    EXPECT_EQ(rb.f32()[i], 10 + i);
  }
  EXPECT_THROW(exchange(self, {P2POp::recv(ra, 0, 5)}), std::logic_error);
  EXPECT_THROW(exchange(self, {P2POp::send(a, 1, 0)}), std::invalid_argument);
}

// ---- launch environment ----

TEST(GridLaunchEnv, NoLauncher) {
  LaunchEnv e = parse_launch_env({{"HOME", "/root"}}, "box");
  EXPECT_EQ(e.launcher, Launcher::None);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_size, 1);
  EXPECT_EQ(e.host, "box");
}

TEST(GridLaunchEnv, OpenMpi) {
  LaunchEnv e = parse_launch_env({{"OMPI_COMM_WORLD_RANK", "5"},
                                  {"OMPI_COMM_WORLD_SIZE", "8"},
                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}},
                                 "node-b");
  EXPECT_EQ(e.launcher, Launcher::OpenMPI);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 4);
  EXPECT_EQ(e.host, "node-b");
  EXPECT_NE(e.source.find("OMPI_COMM_WORLD_RANK=5"), std::string::npos);
}

TEST(GridLaunchEnv, OpenMpiInsideSlurmAllocationPrefersOpenMpi) {
  // mpirun in a batch script: the batch shell's SLURM_PROCID=0 is inherited by every rank.
  LaunchEnv e = parse_launch_env({{"SLURM_PROCID", "0"},
                                  {"SLURM_NTASKS", "8"},
                                  {"SLURMD_NODENAME", "gpu01"},
                                  {"OMPI_COMM_WORLD_RANK", "3"},
                                  {"OMPI_COMM_WORLD_SIZE", "8"}},
                                 "gpu01.cluster");
  EXPECT_EQ(e.launcher, Launcher::OpenMPI);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_size, -1);  // unknown: filled from host names after MPI_Init
}

TEST(GridLaunchEnv, SlurmSrun) {
  LaunchEnv e = parse_launch_env({{"SLURM_PROCID", "13"},
                                  {"SLURM_NTASKS", "14"},
                                  {"SLURM_LOCALID", "0"},
                                  {"SLURM_NODEID", "3"},
                                  {"SLURM_STEP_TASKS_PER_NODE", "4(x3),2"},
                                  {"SLURM_TASKS_PER_NODE", "8(x4)"},
                                  {"SLURMD_NODENAME", "gpu07"}},
                                 "ignored");
  EXPECT_EQ(e.launcher, Launcher::Slurm);
  EXPECT_EQ(e.rank, 13);
  EXPECT_EQ(e.world_size, 14);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_size, 2);  // the step's list wins over the allocation's
  EXPECT_EQ(e.node_rank, 3);
  EXPECT_EQ(e.host, "gpu07");
}

TEST(GridLaunchEnv, SlurmWithPmixRankOnly) {
  LaunchEnv e = parse_launch_env({{"PMIX_RANK", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "4"}}, "n1");
  EXPECT_EQ(e.launcher, Launcher::Slurm);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.local_size, 4);
  EXPECT_EQ(e.host, "n1");
}

TEST(GridLaunchEnv, Hydra) {
  LaunchEnv e = parse_launch_env(
      {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}}, "h");
  EXPECT_EQ(e.launcher, Launcher::Hydra);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.local_size, 2);
}

std::string launch_error(const std::map<std::string, std::string>& env) {
  try {
    parse_launch_env(env, "h");
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "no error";
}

TEST(GridLaunchEnv, Errors) {
  EXPECT_EQ(launch_error({{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
            "environment variable OMPI_COMM_WORLD_RANK='x1' is not a non-negative integer");
  EXPECT_EQ(launch_error({{"OMPI_COMM_WORLD_RANK", "1"}}), "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
  EXPECT_NE(launch_error({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}).find("rank 4 but world size 4"),
            std::string::npos);
  EXPECT_EQ(launch_error({{"SLURM_PROCID", "1"}, {"PMIX_RANK", "2"}, {"SLURM_NTASKS", "4"}}),
            "SLURM_PROCID=1 and PMIX_RANK=2 disagree");
  EXPECT_NE(launch_error({{"OMPI_COMM_WORLD_RANK", "0"},
                          {"OMPI_COMM_WORLD_SIZE", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("local rank 2 but local size 2"),
            std::string::npos);
  EXPECT_EQ(launch_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(x"}}),
            "cannot parse Slurm tasks-per-node list '2(x'");
}

TEST(GridLaunchEnv, SlurmTasksPerNode) {
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), std::vector<int>{4});
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("1,3(x2)"), (std::vector<int>{1, 3, 3}));
  EXPECT_THROW(expand_slurm_tasks_per_node(""), LaunchError);
  EXPECT_THROW(expand_slurm_tasks_per_node("2(y3)"), LaunchError);
  EXPECT_THROW(expand_slurm_tasks_per_node("a"), LaunchError);
}

// ---- layout description ----

std::vector<std::string> hosts_by_block(int world, int per_host) {
  std::vector<std::string> h;
  for (int r = 0; r < world; ++r) h.push_back("node" + std::to_string(r / per_host));
  return h;
}

TEST(GridLayoutDescription, ListsGroupsWithHosts) {
  GridLayout g(8, 2, 2, 2);
  std::string d = describe_layout(g, hosts_by_block(8, 4));
  EXPECT_NE(d.find("process grid: world 8 = tensor 2 x pipeline 2 x data 2 (rank = tp + 2 * (dp + 2 * pp)) on 2 host(s)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("  tp group 3 [dp 1, pp 1]: ranks 6, 7 on node1\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  dp group 0 [tp 0, pp 0]: ranks 0, 2 on node0\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  pp group 1 [tp 1, dp 0]: ranks 1 (node0), 5 (node1)\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  embedding group 0 [tp 0, dp 0]: ranks 0 (node0), 4 (node1)\n"), std::string::npos) << d;
  EXPECT_EQ(d.find("warning"), std::string::npos) << d;
  EXPECT_TRUE(layout_warnings(g, hosts_by_block(8, 4)).empty());
}

TEST(GridLayoutDescription, WarnsWhenTensorGroupsSpanHosts) {
  GridLayout g(8, 4, 1, 2);
  auto warnings = layout_warnings(g, hosts_by_block(8, 2));  // two ranks per host, TP groups of four
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("2 of 2 tensor-parallel groups span hosts (group 0 on node0, node1; group 1 on node2, node3)"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(describe_layout(g, hosts_by_block(8, 2)).find("warning: 2 of 2"), std::string::npos);
  auto wide = layout_warnings(GridLayout(16, 16, 1), hosts_by_block(16, 8));
  EXPECT_EQ(wide.size(), 2u);
  EXPECT_THROW(describe_layout(g, hosts_by_block(4, 4)), std::invalid_argument);
}

}  // namespace
}  // namespace gpt
