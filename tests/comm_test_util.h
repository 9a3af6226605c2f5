// Helpers shared by the multi-rank communicator tests (comm_test, ring_reduce_test): host tensors, the
// world's rank and size, and the `Comm` fixture, which checks for 8 ranks and gives each test a private
// duplicate of MPI_COMM_WORLD.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "parallel/mpi_communicator.h"

namespace gpt {

inline Tensor host_tensor(int64_t n, DType dtype = DType::F32) {
  auto st = std::make_shared<Storage>();
  st->bytes = n * dtype_size(dtype);
  st->ptr = new char[st->bytes ? st->bytes : 1];
  st->deleter = [](void* p, size_t) { delete[] static_cast<char*>(p); };
  return Tensor(st, 0, {n}, dtype);
}

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

class Comm : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(world_size(), 8) << "the communicator tests expect 8 ranks";
    world = MpiCommunicator::dup(MPI_COMM_WORLD, "world");
  }
  std::unique_ptr<MpiCommunicator> world;
};

}  // namespace gpt
