// SingleThreadedBlas: saves OpenBLAS's thread count, drops it to one, and restores it on scope exit.
#include "model/ops/cpu/cpu_parallel.h"

#include <cblas.h>

namespace gpt::cpu {

SingleThreadedBlas::SingleThreadedBlas() : saved_(openblas_get_num_threads()) {
  if (saved_ != 1) openblas_set_num_threads(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (saved_ != 1) openblas_set_num_threads(saved_);
}

}  // namespace gpt::cpu
