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
// The same sample split in two, for loops over one stream: the stream's key is computed once, and
// normal_at(normal_stream_key(seed, h), i) == counter_normal(seed, h, i) bit for bit.
uint64_t normal_stream_key(uint64_t seed, uint64_t name_hash);
float normal_at(uint64_t stream_key, int64_t index);

}  // namespace gpt
