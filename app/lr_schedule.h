// Learning-rate schedule, as Megatron-LM's: linear warmup to lr over warmup_iters, then a decay chosen
// by style until decay_iters (train_iters when 0) and min_lr afterwards:
//   cosine:              min_lr + (lr - min_lr) (1 + cos(pi r)) / 2, r = (it - warmup) / (decay - warmup)
//   linear:              min_lr + (lr - min_lr) (1 - r)
//   constant:            lr throughout (also past decay_iters)
//   inverse-square-root: max(min_lr, lr sqrt(max(warmup, 1) / it))
// Iterations count from 1.
#pragma once
#include <cstdint>
#include <string>

namespace gpt {

enum class LrDecayStyle { Cosine, Linear, Constant, InverseSquareRoot };

// "cosine", "linear", "constant", "inverse-square-root"; throws std::invalid_argument naming the key otherwise.
LrDecayStyle parse_lr_decay_style(const std::string& name);

struct LrSchedule {
  double lr = 0, min_lr = 0;
  int64_t warmup_iters = 0, decay_iters = 0;
  LrDecayStyle style = LrDecayStyle::Cosine;
  double at(int64_t iteration) const;
};

}  // namespace gpt
