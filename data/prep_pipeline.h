// The `gpt-train prep` pipeline: documents are read in order, tokenized by a pool of worker threads
// (an end-of-document id appended to each), put back in input order, and written into HDF5 shards of
// about `shard_tokens` tokens (a shard closes at the first document boundary past that size) named
// P_00000.h5, P_00001.h5, ... plus the index P.index.json that training reads. Every file is written
// atomically, and the index last: a failed run leaves no index, so it cannot be trained on by mistake.
// With `from_megatron` set, the documents come instead, already tokenized, from a Megatron-LM indexed
// dataset (data/megatron_import.h) and go into the same kind of shards and index.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace gpt {

struct PrepOptions {
  std::vector<std::string> inputs;  // files or directories (see document_reader.h)
  std::string from_megatron;        // or: PREFIX of a Megatron-LM PREFIX.bin + PREFIX.idx (no --input then)
  std::string output_prefix;
  std::string tokenizer = "bytes";  // bytes | gpt2 | spm
  std::string vocab_file;           // gpt2: vocab.json; spm: an existing .model (else one is trained)
  std::string merges_file;          // gpt2: merges.txt
  int64_t vocab_size = 0;           // spm training: pieces in the trained model
  int64_t shard_tokens = 0;         // 0: derived from shard_mb
  double shard_mb = 64;             // stored token bytes per shard
  int workers = 0;                  // 0: one per hardware thread
  std::optional<std::string> doc_separator;
  std::string json_key = "text";
  int64_t spm_train_bytes = int64_t(256) << 20;  // text the SentencePiece trainer sees at most
};

struct PrepProgress {
  int64_t docs = 0, tokens = 0, bytes_in = 0;  // written so far
  double seconds = 0;
  bool done = false;
};

struct PrepResult {
  int64_t docs = 0, tokens = 0, bytes_in = 0, skipped_empty = 0;
  int64_t eod_appended = 0;    // from_megatron: documents that did not end with the end-of-document id
  double seconds = 0;          // tokenize + write (SentencePiece training excluded)
  double train_seconds = 0;    // SentencePiece training, when it ran
  double unigram_perplexity = 0;
  std::string tokenizer, tokenizer_hash, tokenizer_model;  // model: the trained .model file, if any
  int64_t vocab_size = 0, eod_id = 0;
  std::vector<std::string> shards;
  std::string index;
};

// The tokenizer `opt` asks for; trains (and writes P.spm.model) for spm without a model file.
std::unique_ptr<Tokenizer> make_prep_tokenizer(const PrepOptions& opt, double* train_seconds = nullptr,
                                               std::string* trained_model = nullptr);

class ShardSetWriter;
// Closes the shard set `writer` wrote and records it in `result`: documents, tokens, shards, index file,
// unigram perplexity and the tokenizer. `result.seconds` and `bytes_in` are the caller's.
void finish_prep_result(ShardSetWriter& writer, const Tokenizer& tok, const std::string& output_prefix,
                        PrepResult& result);

// Runs the whole pipeline. `progress` (optional) is called from the writer thread a few times a second
// and once at the end with done = true. Throws std::runtime_error naming the file on any bad input.
PrepResult run_prep(const PrepOptions& opt, const std::function<void(const PrepProgress&)>& progress = {});

}  // namespace gpt
