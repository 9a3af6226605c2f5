// Process grid arithmetic (validation, rank <-> coordinate, group membership, split colors) and the
// construction of a rank's communicators from it, over MPI or as SelfCommunicators for one process.
#include "parallel/grid/process_grid.h"

#include <algorithm>
#include <climits>

#include "parallel/comm/mpi_communicator.h"  // brings <mpi.h>

namespace gpt {

const char* group_kind_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::Tensor: return "tp";
    case GroupKind::Context: return "cp";
    case GroupKind::Data: return "dp";
    case GroupKind::Pipeline: return "pp";
    case GroupKind::Embedding: return "embedding";
    case GroupKind::ModelParallel: return "model_parallel";
  }
  return "?";
}

static void require_degree(const char* what, int value) {
  if (value < 1) throw GridError(std::string(what) + " size must be at least 1 (got " + std::to_string(value) + ")");
}

GridLayout::GridLayout(int world, int tp, int pp, int dp, int cp) {
  require_degree("world", world);
  require_degree("tensor-parallel", tp);
  require_degree("pipeline-parallel", pp);
  require_degree("context-parallel", cp);
  if (dp < 0) throw GridError("data-parallel size must be at least 1, or 0 to derive it (got " + std::to_string(dp) + ")");
  const int64_t model = int64_t(tp) * pp * cp;
  const std::string context = cp > 1 ? ") x context (" + std::to_string(cp) : "";
  if (dp == 0) {
    if (world % model != 0)
      throw GridError("world size " + std::to_string(world) + " is not divisible by tensor (" + std::to_string(tp) +
                      ") x pipeline (" + std::to_string(pp) + context + ") = " + std::to_string(model) +
                      ", so the data-parallel size cannot be derived");
    dp = static_cast<int>(world / model);
  }
  int64_t product = model * dp;
  if (product != world)
    throw GridError("world size " + std::to_string(world) + " does not equal tensor (" + std::to_string(tp) +
                    ") x pipeline (" + std::to_string(pp) + context + ") x data (" + std::to_string(dp) +
                    ") = " + std::to_string(product));
  world_ = world;
  tp_ = tp;
  pp_ = pp;
  dp_ = dp;
  cp_ = cp;
}

void GridLayout::check_rank(int rank) const {
  if (rank < 0 || rank >= world_)
    throw GridError("rank " + std::to_string(rank) + " is outside the grid of world size " + std::to_string(world_));
}

int GridLayout::rank_of(GridCoord c) const {
  if (c.tp < 0 || c.tp >= tp_ || c.dp < 0 || c.dp >= dp_ || c.pp < 0 || c.pp >= pp_ || c.cp < 0 || c.cp >= cp_)
    throw GridError("coordinate (tp " + std::to_string(c.tp) + ", cp " + std::to_string(c.cp) + ", dp " +
                    std::to_string(c.dp) + ", pp " + std::to_string(c.pp) + ") is outside the grid " + str());
  return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp));
}

GridCoord GridLayout::coord_of(int rank) const {
  check_rank(rank);
  GridCoord c;
  c.tp = rank % tp_;
  c.cp = (rank / tp_) % cp_;
  c.dp = (rank / (tp_ * cp_)) % dp_;
  c.pp = rank / (tp_ * cp_ * dp_);
  return c;
}

namespace {
GridCoord with(GridCoord c, int tp, int cp, int dp, int pp) {
  if (tp >= 0) c.tp = tp;
  if (cp >= 0) c.cp = cp;
  if (dp >= 0) c.dp = dp;
  if (pp >= 0) c.pp = pp;
  return c;
}
}  // namespace

int GridLayout::group_size(GroupKind kind) const {
  switch (kind) {
    case GroupKind::Tensor: return tp_;
    case GroupKind::Context: return cp_;
    case GroupKind::Data: return dp_ * cp_;
    case GroupKind::Pipeline: return pp_;
    case GroupKind::Embedding: return pp_ == 1 ? 1 : 2;
    case GroupKind::ModelParallel: return tp_ * pp_;
  }
  return 1;
}

int GridLayout::num_groups(GroupKind kind) const {
  switch (kind) {
    case GroupKind::Tensor: return cp_ * dp_ * pp_;
    case GroupKind::Context: return tp_ * dp_ * pp_;
    case GroupKind::Data: return tp_ * pp_;
    case GroupKind::Pipeline: return tp_ * cp_ * dp_;
    case GroupKind::Embedding: return tp_ * cp_ * dp_;
    case GroupKind::ModelParallel: return cp_ * dp_;
  }
  return 1;
}

std::vector<int> GridLayout::members(GroupKind kind, int rank) const {
  GridCoord c = coord_of(rank);
  std::vector<int> out;
  switch (kind) {
    case GroupKind::Tensor:
      for (int t = 0; t < tp_; ++t) out.push_back(rank_of(with(c, t, -1, -1, -1)));
      break;
    case GroupKind::Context:
      for (int x = 0; x < cp_; ++x) out.push_back(rank_of(with(c, -1, x, -1, -1)));
      break;
    case GroupKind::Data:
      for (int d = 0; d < dp_; ++d)
        for (int x = 0; x < cp_; ++x) out.push_back(rank_of(with(c, -1, x, d, -1)));
      break;
    case GroupKind::Pipeline:
      for (int p = 0; p < pp_; ++p) out.push_back(rank_of(with(c, -1, -1, -1, p)));
      break;
    case GroupKind::Embedding:
      out.push_back(rank_of(with(c, -1, -1, -1, 0)));
      if (pp_ > 1) out.push_back(rank_of(with(c, -1, -1, -1, pp_ - 1)));
      break;
    case GroupKind::ModelParallel:
      for (int p = 0; p < pp_; ++p)
        for (int t = 0; t < tp_; ++t) out.push_back(rank_of(with(c, t, -1, -1, p)));
      break;
  }
  return out;
}

bool GridLayout::in_group(GroupKind kind, int rank) const {
  GridCoord c = coord_of(rank);
  if (kind == GroupKind::Embedding) return c.pp == 0 || c.pp == pp_ - 1;
  return true;
}

GroupSplit GridLayout::split_for(GroupKind kind, int rank) const {
  GridCoord c = coord_of(rank);
  switch (kind) {
    case GroupKind::Tensor: return {c.cp + cp_ * (c.dp + dp_ * c.pp), c.tp};
    case GroupKind::Context: return {c.tp + tp_ * (c.dp + dp_ * c.pp), c.cp};
    case GroupKind::Data: return {c.tp + tp_ * c.pp, c.cp + cp_ * c.dp};
    case GroupKind::Pipeline: return {c.tp + tp_ * (c.cp + cp_ * c.dp), c.pp};
    case GroupKind::Embedding:
      if (!in_group(kind, rank)) return {-1, 0};
      return {c.tp + tp_ * (c.cp + cp_ * c.dp), c.pp == 0 ? 0 : 1};
    case GroupKind::ModelParallel: return {c.cp + cp_ * c.dp, c.tp + tp_ * c.pp};
  }
  return {};
}

std::vector<std::vector<int>> GridLayout::all_groups(GroupKind kind) const {
  std::vector<std::vector<int>> groups(num_groups(kind));
  for (int r = 0; r < world_; ++r) {
    GroupSplit s = split_for(kind, r);
    if (s.color >= 0 && groups[s.color].empty()) groups[s.color] = members(kind, r);
  }
  return groups;
}

std::string GridLayout::warning() const {
  if (tp_ > 8)
    return "tensor-parallel size " + std::to_string(tp_) +
           " is wider than one 8-GPU node; tensor parallelism communicates every layer and is slow across nodes";
  return {};
}

std::string GridLayout::str() const {
  return "world " + std::to_string(world_) + " = tensor " + std::to_string(tp_) + " x pipeline " +
         std::to_string(pp_) + (cp_ > 1 ? " x context " + std::to_string(cp_) : "") + " x data " +
         std::to_string(dp_);
}

// ---- communicators ----

ParallelState single_process_state() {
  ParallelState s;
  s.world = std::make_unique<SelfCommunicator>("world");
  s.tp = std::make_unique<SelfCommunicator>("tp");
  s.cp = std::make_unique<SelfCommunicator>("cp");
  s.dp = std::make_unique<SelfCommunicator>("dp");
  s.pp = std::make_unique<SelfCommunicator>("pp");
  s.embedding = std::make_unique<SelfCommunicator>("embedding");
  s.model_parallel = std::make_unique<SelfCommunicator>("model_parallel");
  return s;
}

static ParallelState build_mpi_state(const GridLayout& layout, MPI_Comm parent) {
  int size = 0, rank = 0;
  MPI_Comm_size(parent, &size);
  MPI_Comm_rank(parent, &rank);
  // The communicator size is the same on every rank, so this throws everywhere or nowhere.
  if (size != layout.world())
    throw GridError("the process grid needs " + std::to_string(layout.world()) + " ranks (" + layout.str() +
                    ") but " + std::to_string(size) + " were launched");
  ParallelState s;
  s.layout = layout;
  s.rank = rank;
  s.coord = layout.coord_of(rank);

  // Every rank takes the same branch for each kind (sizes are global), so the collective splits line up.
  auto make = [&](GroupKind kind) -> std::unique_ptr<Communicator> {
    const char* name = group_kind_name(kind);
    if (layout.group_size(kind) == 1)
      return layout.in_group(kind, rank) ? std::make_unique<SelfCommunicator>(name) : nullptr;
    GroupSplit split = layout.split_for(kind, rank);
    auto comm = MpiCommunicator::split(parent, split.color, split.key, name);
    if (comm) {
      // MPI orders the group by key, which must reproduce the layout's member order exactly.
      std::vector<int> expected = layout.members(kind, rank);
      if (comm->size() != static_cast<int>(expected.size()) || expected[comm->rank()] != rank)
        throw std::logic_error(std::string("process grid: MPI group '") + name + "' disagrees with the layout on rank " +
                               std::to_string(rank));
    }
    return comm;
  };
  if (size == 1)
    s.world = std::make_unique<SelfCommunicator>("world");
  else
    s.world = MpiCommunicator::dup(parent, "world");
  s.tp = make(GroupKind::Tensor);
  s.cp = make(GroupKind::Context);
  s.dp = make(GroupKind::Data);
  s.pp = make(GroupKind::Pipeline);
  s.embedding = make(GroupKind::Embedding);
  s.model_parallel = make(GroupKind::ModelParallel);
  return s;
}

ParallelState mpi_parallel_state(const GridLayout& layout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw std::runtime_error("mpi_parallel_state: MPI is not initialised");
  return build_mpi_state(layout, MPI_COMM_WORLD);
}

ParallelState mpi_parallel_state(const GridLayout& layout, const MpiCommunicator& parent) {
  return build_mpi_state(layout, parent.handle());
}

}  // namespace gpt
