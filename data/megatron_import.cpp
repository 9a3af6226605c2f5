// Megatron-LM indexed dataset -> token shards (see megatron_import.h): one pass, document by document,
// from MegatronIndexedReader into ShardSetWriter.
#include "data/megatron_import.h"

#include <chrono>
#include <stdexcept>

#include "data/megatron_indexed.h"
#include "data/shard_set_writer.h"

namespace gpt {

PrepResult import_megatron(const PrepOptions& opt, const std::function<void(const PrepProgress&)>& progress) {
  if (opt.output_prefix.empty()) throw std::runtime_error("--output-prefix is required");
  if (opt.tokenizer == "spm" && opt.vocab_file.empty())
    throw std::runtime_error("--from-megatron with --tokenizer spm needs --vocab-file M.model: the model the "
                             "dataset's ids come from");
  auto tokenizer = make_prep_tokenizer(opt);
  const Tokenizer& tok = *tokenizer;
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  MegatronIndexedReader reader(opt.from_megatron);
  PrepResult result;
  ShardSetWriter writer(opt.output_prefix, tok, shard_tokens_for(opt.shard_tokens, opt.shard_mb, tok.vocab_size()));
  const int32_t eod = int32_t(tok.eod_id());
  std::vector<int32_t> ids;
  double last_report = 0;
  while (reader.next_document(ids, tok.vocab_size())) {
    if (ids.empty()) {
      ++result.skipped_empty;
      continue;
    }
    if (ids.back() != eod) {
      ids.push_back(eod);
      ++result.eod_appended;
    }
    writer.add(ids);
    if (progress && elapsed() - last_report >= 0.25) {
      last_report = elapsed();
      progress({writer.docs(), writer.tokens(), reader.bytes_read(), last_report, false});
    }
  }
  if (writer.docs() == 0)
    throw std::runtime_error("no documents in " + reader.idx_path() + " (" + std::to_string(reader.num_documents()) +
                             " documents, all empty)");
  finish_prep_result(writer, tok, opt.output_prefix, result);
  result.seconds = elapsed();
  result.bytes_in = reader.bytes_read();
  if (progress) progress({result.docs, result.tokens, result.bytes_in, result.seconds, true});
  return result;
}

}  // namespace gpt
