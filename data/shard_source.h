// Training / validation / test samples from token shards, Megatron-style. The documents of a shard set
// are split into train / valid / test ranges by a split string ("969,30,1"); in each epoch the split's
// documents are concatenated in a shuffled order (end-of-document ids between them) and cut into samples
// of seq_length + 1 tokens that overlap by one token, and the samples themselves are visited in a
// shuffled order. Both shuffles are pure functions of (seed, epoch), so sample i is the same whatever
// the parallel layout, and resuming at consumed_samples simply continues the index. Several shard sets
// can be blended by weight ("0.7 A 0.3 B"); see docs/data-format.md.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/sample_source.h"

namespace gpt {

// One weighted component of a data spec: a shard set made of one or more shard files / prefixes.
struct DataBlendEntry {
  double weight = 1;
  std::vector<std::string> paths;
};

// The words of a data spec: each entry is one word (a path, spaces and all, or a weight), except an entry
// that starts with a weight followed by whitespace, Megatron-LM's "0.7 data/a 0.3 data/b" string, which
// is split at whitespace. Surrounding whitespace is trimmed and blank entries dropped. (A path whose
// first word is a number is written with a directory in front: "./2024 corpus/a".)
std::vector<std::string> data_spec_words(const std::vector<std::string>& entries);

// Parses a data spec (its data_spec_words): either every word is a shard file or prefix (one shard set,
// weight 1), or the words alternate weight, path ("0.7 data/a 0.3 data/b"). Throws std::runtime_error
// naming `what` on a malformed spec.
std::vector<DataBlendEntry> parse_data_spec(const std::vector<std::string>& entries,
                                            const std::string& what = "data.train");

// `split_name` is train, valid or test (the range of `split` to use), or all (every document, `split`
// ignored: for a data.valid given separately). `expected_tokenizer` is "" (accept any), a tokenizer name
// ("gpt2") or name@hash ("gpt2@fnv1a64:..."). Throws std::runtime_error naming the file or spec when a
// shard is missing or invalid, the tokenizer differs, the vocabulary exceeds model_vocab_size, or the
// split holds fewer than seq_length + 1 tokens.
std::unique_ptr<SampleSource> make_shard_source(const std::vector<std::string>& paths_or_prefixes,
                                                const std::string& split_name, const std::string& split,
                                                int64_t seq_length, uint64_t seed,
                                                const std::string& expected_tokenizer, int64_t model_vocab_size);

// What a data spec holds, summed over its shard sets (for logs and checks before training).
struct ShardDataInfo {
  std::string tokenizer, tokenizer_hash;
  int64_t vocab_size = 0, eod_id = -1;
  int64_t num_shards = 0, num_docs = 0, num_tokens = 0;
};
ShardDataInfo read_shard_data_info(const std::vector<std::string>& paths_or_prefixes);

}  // namespace gpt
