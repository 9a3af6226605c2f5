// Learning-rate schedule, as Megatron-LM's OptimizerParamScheduler: linear warmup from 0 to lr over
// warmup_iters steps, then a decay chosen by style until decay_iters (train_iters when 0) and min_lr
// afterwards. The position in the schedule is the number of optimizer steps already applied, n:
//   warmup (n <= warmup):  lr n / warmup
//   cosine:                min_lr + (lr - min_lr) (1 + cos(pi r)) / 2, r = (n - warmup) / (decay - warmup)
//   linear:                min_lr + (lr - min_lr) (1 - r)
//   constant:              lr throughout (also past decay_iters)
//   inverse-square-root:   max(min_lr, lr sqrt(max(warmup, 1) / max(n, 1)))
//   past decay (n > decay): min_lr
// Megatron steps its scheduler after a successful optimizer step, so iteration 1 runs at at(0) (0 during
// warm-up) and a step skipped for fp16 overflow does not advance the schedule: the trainer passes the
// count of applied steps (AdamW's step count, which a checkpoint stores), not the iteration number.
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
  // The rate of the optimizer step that follows `applied_steps` applied (not skipped) steps.
  double at(int64_t applied_steps) const;
};

}  // namespace gpt
