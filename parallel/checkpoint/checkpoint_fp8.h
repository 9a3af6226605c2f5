// FP8 scaling state in checkpoints (precision.fp8, model/fp8_scaling.h). Each FP8 operand is one
// replicated F32 tensor of kind "fp8" under its global name ("layers.3.mlp.fc1.fp8.input"), of shape
// [2 + history_len]: [scale, n, the n newest amaxes, zeros]. The rank with tensor- and data-parallel
// (data x context) rank 0 of each stage writes its layers' entries; every rank reads the entries of the
// layers it holds in its own layout, so the state reshards like any replicated tensor. The entries are
// optional both ways: a run with FP8 off ignores them, and one with FP8 on that finds none (a bf16
// checkpoint) starts its scales at 1, as a fresh run does.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "model/fp8_scaling.h"
#include "model/tensor.h"

namespace gpt {

bool is_fp8_state_name(const std::string& name);
std::vector<float> pack_fp8_scale(const Fp8TensorScale& s, int64_t history_len);
// Restores s from a stored entry; throws CheckpointError naming `where` and the tensor when it is malformed.
// A history longer than the recipe's keeps its newest entries.
void unpack_fp8_scale(const std::vector<float>& stored, const Fp8Recipe& recipe, Fp8TensorScale& s,
                      const std::string& where);

}  // namespace gpt
