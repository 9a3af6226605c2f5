// Checks that run once at start-up, on every rank alike, so a run that cannot finish fails before its
// first step rather than hours later: every rank runs the same effective config (an MPMD launch or a
// node with another copy of the file would otherwise corrupt memory or hang), and the validation data
// the run will read opens and holds at least one sequence (the training data opens with the model). Each failure is the same StartupError on every
// rank, naming the key, the file or the ranks involved.
#pragma once
#include <cstdint>
#include <string>

#include "app/config.h"
#include "model/communicator.h"

namespace gpt {

// A 64-bit FNV-1a hash of `text` (the effective config's dump), as 16 hex digits.
std::string config_hash(const std::string& text);

// Compares the hash of every rank's dump_config(cfg) over `world` (collective); throws StartupError
// naming the ranks whose config differs from rank 0's and the keys that differ for the first of them.
void require_same_config(Communicator& world, const Config& cfg);

// Opens the validation split when train evaluates (eval.interval > 0) or data.valid is set, and always
// for eval. Collective: throws StartupError alike on every rank with the first failing rank's message.
void check_validation_data_at_startup(Communicator& world, const Config& cfg, bool train);

}  // namespace gpt
