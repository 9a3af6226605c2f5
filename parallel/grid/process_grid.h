// The process grid: how the world's ranks are arranged into tensor-, context-, data- and pipeline-parallel
// groups. Two layers. GridLayout is pure arithmetic with no MPI in it (Megatron-Core's order: rank = tp +
// TP * (cp + CP * (dp + DP * pp))), so every rank validates the same numbers the same way and a bad layout fails identically
// everywhere instead of leaving some ranks waiting in a collective. ParallelState then turns a layout into
// communicators: MPI groups made with MPI_Comm_split (the split colors and keys come from GridLayout, so
// the pure tests cover them), or SelfCommunicators for a single process that needs no MPI at all.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/communicator.h"

namespace gpt {

struct ParallelConfig;
class MpiCommunicator;

// Thrown for an impossible layout; the message names the sizes involved. The same inputs give the same
// message on every rank.
struct GridError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A rank's position in the grid.
struct GridCoord {
  int tp = 0;
  int dp = 0;
  int pp = 0;
  int cp = 0;
  bool operator==(const GridCoord&) const = default;
};

// The communicator groups every rank belongs to.
//  Tensor: same cp, dp and pp (consecutive ranks, so they share a node);
//  Context: same tp, dp and pp (the ring one sequence's chunks are spread over, parallel.context);
//  Data: same tp and pp, every dp and cp (the replicas whose gradients are summed: Megatron-Core's
//        data-parallel group with context parallelism, ordered by cp fastest);
//  Pipeline: same tp, cp and dp (the stages one microbatch flows through);
//  Embedding: the first and last stage of one pipeline (tied input/output embedding gradients);
//  ModelParallel: all tp x pp ranks of one data-parallel replica (global gradient norm).
enum class GroupKind { Tensor, Context, Data, Pipeline, Embedding, ModelParallel };
const char* group_kind_name(GroupKind kind);  // "tp", "cp", "dp", "pp", "embedding", "model_parallel"

// Arguments for MPI_Comm_split: ranks with equal color form one group, ordered by key (the rank's index in
// the group). color < 0 means the rank belongs to no group of this kind (middle pipeline stages have no
// embedding group).
struct GroupSplit {
  int color = 0;
  int key = 0;
};

class GridLayout {
 public:
  // A single process: world 1, every degree 1.
  GridLayout() = default;
  // Validates and fixes the layout; dp == 0 derives it as world / (tp * cp * pp). Throws GridError when a
  // degree is below 1, when dp cannot be derived, or when world != tp * cp * dp * pp.
  GridLayout(int world, int tp, int pp, int dp = 0, int cp = 1);

  int world() const { return world_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int cp() const { return cp_; }

  // Megatron's order. Both throw GridError for a rank or coordinate outside the grid.
  int rank_of(GridCoord c) const;
  GridCoord coord_of(int rank) const;

  int group_size(GroupKind kind) const;
  int num_groups(GroupKind kind) const;
  // Global ranks of `rank`'s group of this kind, in group-rank order. For Embedding this is the first and
  // last stage of rank's pipeline (just that one rank when pp == 1), whether or not `rank` is one of them;
  // see in_group.
  std::vector<int> members(GroupKind kind, int rank) const;
  bool in_group(GroupKind kind, int rank) const;
  GroupSplit split_for(GroupKind kind, int rank) const;
  // Every group of this kind, ordered by color.
  std::vector<std::vector<int>> all_groups(GroupKind kind) const;

  std::vector<int> tp_group(int rank) const { return members(GroupKind::Tensor, rank); }
  std::vector<int> dp_group(int rank) const { return members(GroupKind::Data, rank); }
  std::vector<int> pp_group(int rank) const { return members(GroupKind::Pipeline, rank); }
  std::vector<int> embedding_group(int rank) const { return members(GroupKind::Embedding, rank); }
  std::vector<int> model_parallel_group(int rank) const { return members(GroupKind::ModelParallel, rank); }

  // A layout that works but is likely slow (tensor parallelism wider than one 8-GPU node); empty if none.
  std::string warning() const;
  // "world 8 = tensor 2 x pipeline 2 x data 2" (with " x context 2" before data when cp > 1).
  std::string str() const;

 private:
  void check_rank(int rank) const;
  int world_ = 1, tp_ = 1, pp_ = 1, dp_ = 1, cp_ = 1;
};


// This rank's communicators and coordinates. Groups of one rank are SelfCommunicators (no MPI calls, and no
// bytes counted for traffic that never happens). `embedding` is null on ranks outside every embedding
// group (middle pipeline stages).
// `dp` is the gradient group (GroupKind::Data: dp x cp ranks), and dp_rank() / dp_size() are this rank's
// place in it: what gradient reduction, the distributed optimizer's shards, checkpoint ownership and the
// loss average need. The samples a rank reads depend on its data-parallel coordinate alone (coord.dp of
// layout.dp(): the context-parallel ranks of a replica read the same sequences and take their chunks).
struct ParallelState {
  GridLayout layout;
  int rank = 0;  // in the grid's world
  GridCoord coord;
  std::unique_ptr<Communicator> world, tp, cp, dp, pp, embedding, model_parallel;

  int tp_rank() const { return coord.tp; }
  int cp_rank() const { return coord.cp; }
  int dp_rank() const { return coord.cp + layout.cp() * coord.dp; }
  int pp_rank() const { return coord.pp; }
  int tp_size() const { return layout.tp(); }
  int cp_size() const { return layout.cp(); }
  int dp_size() const { return layout.dp() * layout.cp(); }
  int pp_size() const { return layout.pp(); }
  bool is_first_stage() const { return coord.pp == 0; }
  bool is_last_stage() const { return coord.pp == layout.pp() - 1; }
};

// One process, no MPI: every group is a SelfCommunicator.
ParallelState single_process_state();
// Collective over MPI_COMM_WORLD (or `parent`): every rank must call it with the same layout. Throws
// GridError on every rank alike when the layout's world differs from the communicator's size.
ParallelState mpi_parallel_state(const GridLayout& layout);
ParallelState mpi_parallel_state(const GridLayout& layout, const MpiCommunicator& parent);

}  // namespace gpt
