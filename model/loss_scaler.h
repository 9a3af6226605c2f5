// Loss scaling for mixed precision. fp32 and bf16 use a constant scale of 1. fp16 uses Megatron's dynamic
// scaler: start at 2^32; a step whose gradients overflow (Inf/NaN) is skipped and, after `hysteresis`
// such steps, the scale halves (never below min_scale); after `window` clean steps in a row it doubles.
#pragma once
#include <cstdint>

namespace gpt {

class LossScaler {
 public:
  struct State {
    double scale = 1;
    int64_t growth_tracker = 0;
    int64_t hysteresis_tracker = 2;
  };
  static LossScaler constant() { return LossScaler(false, 1.0, 1.0, 1, 1); }
  static LossScaler dynamic_fp16() { return LossScaler(true, 4294967296.0, 1.0, 1000, 2); }
  LossScaler(bool dynamic, double initial, double min_scale, int64_t window, int64_t hysteresis);

  double scale() const { return state_.scale; }
  bool dynamic() const { return dynamic_; }
  double min_scale() const { return min_scale_; }
  // Records the outcome of a step; returns true when the step's gradients may be applied.
  bool update(bool found_overflow);
  const State& state() const { return state_; }
  void set_state(const State& s) { state_ = s; }

 private:
  bool dynamic_;
  double min_scale_;
  int64_t window_, hysteresis_;
  State state_;
};

}  // namespace gpt
