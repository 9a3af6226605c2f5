// Dynamic loss scaler (Megatron's DynamicGradScaler rules).
#include "model/loss_scaler.h"

#include <algorithm>

namespace gpt {

LossScaler::LossScaler(bool dynamic, double initial, double min_scale, int64_t window, int64_t hysteresis)
    : dynamic_(dynamic), min_scale_(min_scale), window_(window), hysteresis_(hysteresis) {
  state_.scale = initial;
  state_.hysteresis_tracker = hysteresis;
}

bool LossScaler::update(bool found_overflow) {
  if (!dynamic_) return !found_overflow;
  if (found_overflow) {
    state_.growth_tracker = 0;
    if (--state_.hysteresis_tracker <= 0) state_.scale = std::max(state_.scale * 0.5, min_scale_);
    return false;
  }
  if (++state_.growth_tracker == window_) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = hysteresis_;
    state_.scale *= 2.0;
  }
  return true;
}

}  // namespace gpt
