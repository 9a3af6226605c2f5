// `gpt-train prep --from-megatron PREFIX`: converts a Megatron-LM indexed dataset (PREFIX.bin +
// PREFIX.idx, read by data/megatron_indexed.h) into our token shards and index, keeping its documents and
// their order. The ids are taken as they are; the tokenizer they came from is declared by the options
// (Megatron's files do not record it) and is written into the shards as `prep` writes it. A document that
// does not end with the tokenizer's end-of-document id gets one appended; empty documents are skipped.
#pragma once
#include <functional>

#include "data/prep_pipeline.h"

namespace gpt {

// Uses opt.from_megatron, output_prefix, tokenizer, vocab_file, merges_file, shard_tokens, shard_mb.
// `progress` as for run_prep, with bytes_in counting bytes of PREFIX.bin. Throws std::runtime_error
// naming the file on bad input; nothing is written before both files have been validated.
PrepResult import_megatron(const PrepOptions& opt, const std::function<void(const PrepProgress&)>& progress = {});

}  // namespace gpt
