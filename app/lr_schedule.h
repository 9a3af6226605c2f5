// Learning-rate schedule: linear warmup to lr over warmup_iters, then cosine decay to min_lr at
// decay_iters (train_iters when 0), constant min_lr afterwards. Iterations count from 1.
#pragma once
#include <cstdint>

namespace gpt {

struct LrSchedule {
  double lr = 0, min_lr = 0;
  int64_t warmup_iters = 0, decay_iters = 0;
  double at(int64_t iteration) const;
};

}  // namespace gpt
