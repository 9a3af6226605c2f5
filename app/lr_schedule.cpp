// Warmup then cosine, linear, constant or inverse-square-root decay of the learning rate.
#include "app/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gpt {

LrDecayStyle parse_lr_decay_style(const std::string& name) {
  if (name == "cosine") return LrDecayStyle::Cosine;
  if (name == "linear") return LrDecayStyle::Linear;
  if (name == "constant") return LrDecayStyle::Constant;
  if (name == "inverse-square-root") return LrDecayStyle::InverseSquareRoot;
  throw std::invalid_argument("optimizer.lr_decay_style: unknown style '" + name +
                              "' (expected cosine, linear, constant or inverse-square-root)");
}

double LrSchedule::at(int64_t n) const {
  if (warmup_iters > 0 && n <= warmup_iters) return lr * double(n) / double(warmup_iters);
  if (style == LrDecayStyle::Constant) return lr;
  if (n > decay_iters) return min_lr;  // (and so whenever decay_iters <= warmup_iters)
  if (style == LrDecayStyle::InverseSquareRoot)
    return std::max(min_lr, lr * std::sqrt(double(std::max<int64_t>(warmup_iters, 1)) / double(std::max<int64_t>(n, 1))));
  const double progress = double(n - warmup_iters) / double(decay_iters - warmup_iters);
  const double coeff = style == LrDecayStyle::Linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace gpt
