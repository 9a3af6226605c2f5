// Counter-based initialisation: the value of element i of the global tensor `name` is a pure function of
// (seed, name, i). Every parallel layout therefore starts from the same global weights, and a rank fills
// only its own shard without generating anyone else's.
#pragma once
#include <cstdint>
#include <string>

namespace gpt {

uint64_t hash_name(const std::string& name);
uint64_t splitmix64(uint64_t x);
// Uniform in (0, 1) from a 64-bit key.
double uniform_from_key(uint64_t key);
// Standard normal sample number `index` of the stream (seed, name).
float counter_normal(uint64_t seed, uint64_t name_hash, int64_t index);

}  // namespace gpt
