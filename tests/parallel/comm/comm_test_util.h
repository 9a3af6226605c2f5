// Helpers shared by the multi-rank communicator tests (comm_test, ring_reduce_test): host tensors
// (tests/host_tensor.h), the world's rank and size, and the `Comm` fixture, which checks for 8 ranks and
// gives each test a private duplicate of MPI_COMM_WORLD.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>

#include "parallel/comm/mpi_communicator.h"
#include "tests/host_tensor.h"

namespace gpt {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The world's ranks split into consecutive groups of `size`; the ranks left over get no group (nullptr).
inline std::unique_ptr<MpiCommunicator> split_world(int size, const std::string& name) {
  const int r = world_rank();
  const int color = r < (world_size() / size) * size ? r / size : -1;
  return MpiCommunicator::split(MPI_COMM_WORLD, color, r, name);
}

class Comm : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(world_size(), 8) << "the communicator tests expect 8 ranks";
    world = MpiCommunicator::dup(MPI_COMM_WORLD, "world");
  }
  std::unique_ptr<MpiCommunicator> world;
};

}  // namespace gpt
