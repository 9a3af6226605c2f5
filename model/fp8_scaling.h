// Delayed scaling for FP8 GEMMs (Transformer Engine's DelayedScaling recipe). Each FP8 operand of a
// linear layer (its input, its weight, and in backward the gradient of its output) has a per-tensor
// scale: the tensor is multiplied by it before the cast to FP8 and the GEMM's result divided by it, so
// the values fill the format's range. The scale used in iteration k comes from the amaxes (largest
// |value|) seen in iterations before k, never from the tensor being cast: the cast needs no reduction
// first. After each iteration the amax seen then (reduced over the ranks that share the tensor) joins a
// history of the last `history_len` iterations, and
//     amax  = max over the history (algo max) or the newest entry (most_recent)
//     scale = (fp8_max / amax) / 2^margin,  kept unchanged when amax is 0 or not finite.
// The first iteration runs at scale 1. The forward operands are E4M3; the output gradient is E5M2 in the
// hybrid recipe and E4M3 otherwise (precision.fp8: hybrid | e4m3).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/fp8.h"

namespace gpt {

enum class Fp8AmaxAlgo { Max, MostRecent };

struct Fp8Recipe {
  bool enabled = false;
  bool hybrid = true;           // E5M2 gradients
  int64_t history_len = 1024;   // precision.fp8_amax_history_len
  Fp8AmaxAlgo algo = Fp8AmaxAlgo::Max;
  int64_t margin = 0;           // precision.fp8_margin
  Fp8Format forward_format() const { return Fp8Format::E4M3; }
  Fp8Format backward_format() const { return hybrid ? Fp8Format::E5M2 : Fp8Format::E4M3; }
};
// precision.fp8 (off | e4m3 | hybrid) and precision.fp8_amax_compute_algo (max | most_recent); throw
// std::invalid_argument naming the key and the accepted values.
Fp8Recipe parse_fp8_recipe(const std::string& fp8, const std::string& algo, int64_t history_len, int64_t margin);
std::string fp8_recipe_name(const Fp8Recipe& r);  // "off" | "e4m3" | "hybrid"

// One operand's scaling state.
struct Fp8TensorScale {
  std::string name;     // global, e.g. "layers.3.mlp.fc1.fp8.input": the same on every layout
  Fp8Format format = Fp8Format::E4M3;
  float scale = 1.f;
  float pending = 0.f;  // the largest amax recorded in the iteration under way
  std::vector<float> history;  // newest first, at most history_len entries
  void record(float amax) {
    if (!(amax <= pending)) pending = amax;  // NaN propagates
  }
  // Ends the iteration: `reduced` (the pending amax after the reduction over the ranks that share it)
  // joins the history and the scale is recomputed.
  void update(const Fp8Recipe& recipe, float reduced);
};

// The FP8 operands of one model chunk, in registration order (the same order on every rank that holds
// the chunk's layers, so the pending amaxes reduce as one vector).
class Fp8ScaleSet {
 public:
  explicit Fp8ScaleSet(Fp8Recipe recipe = {}) : recipe_(recipe) {}
  const Fp8Recipe& recipe() const { return recipe_; }
  bool enabled() const { return recipe_.enabled; }
  Fp8TensorScale& add(const std::string& name, Fp8Format format);
  std::vector<Fp8TensorScale*> all();
  size_t size() const { return scales_.size(); }
  // The pending amaxes, for a max-reduction; then update() with the reduced values (same order and length).
  std::vector<double> pending() const;
  void update(const std::vector<double>& reduced);

 private:
  Fp8Recipe recipe_;
  std::vector<std::unique_ptr<Fp8TensorScale>> scales_;
};

}  // namespace gpt
