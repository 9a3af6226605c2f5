// Warmup + cosine learning-rate schedule.
#include "app/lr_schedule.h"

#include <cmath>

namespace gpt {

double LrSchedule::at(int64_t it) const {
  if (warmup_iters > 0 && it <= warmup_iters) return lr * double(it) / double(warmup_iters);
  if (it >= decay_iters || decay_iters <= warmup_iters) return min_lr;
  double progress = double(it - warmup_iters) / double(decay_iters - warmup_iters);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace gpt
