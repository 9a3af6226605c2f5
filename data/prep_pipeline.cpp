// Parallel, order-preserving tokenization into shards (see prep_pipeline.h). The reader (calling thread)
// cuts the input into batches of documents; workers decode JSON records and tokenize batches; the writer
// thread takes batches back strictly in input order, so the output, and the error reported for bad input
// (the first in input order), are the same for any number of workers. A bound on batches in flight keeps
// memory flat however large the input is.
#include "data/prep_pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <span>
#include <thread>

#include "data/document_reader.h"
#include "data/megatron_import.h"
#include "data/shard_set_writer.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

struct Batch {
  int64_t seq = 0;
  std::vector<RawDocument> docs;
  int64_t bytes_in = 0;  // input bytes consumed up to the end of this batch
  std::vector<int32_t> tokens;
  std::vector<int64_t> lengths;
  int64_t skipped_empty = 0;  // JSON records whose text is empty
  std::exception_ptr error;   // a malformed record: raised when the writer reaches this batch
};

// Text for the SentencePiece trainer: documents cut at newlines into pieces of at most 4 KiB.
std::vector<std::string> training_sentences(const PrepOptions& opt) {
  DocumentReader reader(expand_inputs(opt.inputs), {opt.doc_separator, opt.json_key});
  std::vector<std::string> out;
  int64_t total = 0;
  std::string doc;
  while (total < opt.spm_train_bytes && reader.next(doc)) {
    size_t pos = 0;
    while (pos < doc.size()) {
      size_t end = std::min(doc.size(), pos + 4096);
      if (end < doc.size()) {
        size_t nl = doc.rfind('\n', end - 1);
        if (nl != std::string::npos && nl >= pos) end = nl + 1;
      }
      out.push_back(doc.substr(pos, end - pos));
      total += int64_t(end - pos);
      pos = end;
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> make_prep_tokenizer(const PrepOptions& opt, double* train_seconds,
                                               std::string* trained_model) {
  if (opt.tokenizer == "bytes") return make_byte_tokenizer();
  if (opt.tokenizer == "gpt2") {
    if (opt.vocab_file.empty() || opt.merges_file.empty())
      throw std::runtime_error("--tokenizer gpt2 needs --vocab-file vocab.json and --merges-file merges.txt");
    return make_gpt2_tokenizer(opt.vocab_file, opt.merges_file);
  }
  if (opt.tokenizer == "spm") {
    if (!opt.vocab_file.empty()) return make_spm_tokenizer(opt.vocab_file);
    if (opt.vocab_size <= 0)
      throw std::runtime_error("--tokenizer spm needs --vocab-size N to train a model on the input (or --vocab-file M.model)");
    auto t0 = std::chrono::steady_clock::now();
    std::string model = opt.output_prefix + ".spm.model";
    int threads = opt.workers > 0 ? opt.workers : int(std::max(1u, std::thread::hardware_concurrency()));
    train_spm_model(training_sentences(opt), opt.vocab_size, threads, model);
    if (train_seconds) *train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (trained_model) *trained_model = model;
    return make_spm_tokenizer(model);
  }
  throw std::runtime_error("--tokenizer '" + opt.tokenizer + "' is not one of bytes, gpt2, spm");
}

void finish_prep_result(ShardSetWriter& writer, const Tokenizer& tok, const std::string& output_prefix,
                        PrepResult& result) {
  const ShardIndex index = writer.finish();
  result.docs = writer.docs();
  result.tokens = writer.tokens();
  result.unigram_perplexity = index.unigram_perplexity;
  result.tokenizer = tok.name();
  result.tokenizer_hash = tok.hash();
  result.vocab_size = tok.vocab_size();
  result.eod_id = tok.eod_id();
  result.shards = writer.paths();
  result.index = shard_index_path(output_prefix);
}

PrepResult run_prep(const PrepOptions& opt, const std::function<void(const PrepProgress&)>& progress) {
  if (opt.output_prefix.empty()) throw std::runtime_error("--output-prefix is required");
  if (!opt.from_megatron.empty()) {
    if (!opt.inputs.empty())
      throw std::runtime_error("--from-megatron and --input exclude each other: convert a Megatron dataset or "
                               "tokenize text, not both");
    return import_megatron(opt, progress);
  }
  std::vector<std::string> files = expand_inputs(opt.inputs);
  fs::path out_dir = fs::path(opt.output_prefix).parent_path();
  std::error_code ec;
  if (!out_dir.empty()) fs::create_directories(out_dir, ec);  // a trained SentencePiece model goes there
  fs::remove(shard_index_path(opt.output_prefix), ec);  // the old index would describe shards we overwrite

  PrepResult result;
  auto tokenizer = make_prep_tokenizer(opt, &result.train_seconds, &result.tokenizer_model);
  const Tokenizer& tok = *tokenizer;
  const int64_t shard_tokens = shard_tokens_for(opt.shard_tokens, opt.shard_mb, tok.vocab_size());
  const int workers = opt.workers > 0 ? opt.workers : int(std::max(1u, std::thread::hardware_concurrency()));
  const size_t max_in_flight = size_t(4 * workers);

  std::mutex m;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Batch>> todo;
  std::map<int64_t, std::unique_ptr<Batch>> done;
  int64_t next_seq = 0, written_seq = 0;
  bool input_finished = false;
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto fail = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(m);
    if (!error) error = e;
    failed = true;
    cv.notify_all();
  };

  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };

  DocumentReader reader(files, {opt.doc_separator, opt.json_key});
  int64_t skipped_records = 0;  // by the writer thread, read after it joined
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      try {
        while (true) {
          std::unique_ptr<Batch> b;
          {
            std::unique_lock<std::mutex> lock(m);
            cv.wait(lock, [&] { return failed || !todo.empty() || input_finished; });
            if (failed || (todo.empty() && input_finished)) return;
            b = std::move(todo.front());
            todo.pop_front();
          }
          try {
            for (auto& raw : b->docs) {
              const std::string text = reader.text(std::move(raw));
              if (text.empty()) {
                ++b->skipped_empty;
                continue;
              }
              size_t before = b->tokens.size();
              tok.encode(text, b->tokens);
              b->tokens.push_back(int32_t(tok.eod_id()));
              b->lengths.push_back(int64_t(b->tokens.size() - before));
            }
          } catch (const std::runtime_error&) {
            b->error = std::current_exception();
          }
          b->docs.clear();
          b->docs.shrink_to_fit();
          std::lock_guard<std::mutex> lock(m);
          done.emplace(b->seq, std::move(b));
          cv.notify_all();
        }
      } catch (...) {
        fail(std::current_exception());
      }
    });

  ShardSetWriter writer(opt.output_prefix, tok, shard_tokens);
  std::thread writer_thread([&] {
    try {
      double last_report = 0;
      int64_t bytes_in = 0;
      while (true) {
        std::unique_ptr<Batch> b;
        {
          std::unique_lock<std::mutex> lock(m);
          cv.wait(lock, [&] { return failed || done.count(written_seq) || (input_finished && written_seq == next_seq); });
          if (failed) return;
          if (!done.count(written_seq)) break;  // everything written
          b = std::move(done[written_seq]);
          done.erase(written_seq);
        }
        if (b->error) std::rethrow_exception(b->error);
        size_t pos = 0;
        for (int64_t len : b->lengths) {
          writer.add(std::span<const int32_t>(b->tokens).subspan(pos, size_t(len)));
          pos += size_t(len);
        }
        bytes_in = b->bytes_in;
        skipped_records += b->skipped_empty;
        {
          std::lock_guard<std::mutex> lock(m);
          ++written_seq;
          cv.notify_all();
        }
        if (progress && elapsed() - last_report >= 0.25) {
          last_report = elapsed();
          progress({writer.docs(), writer.tokens(), bytes_in, last_report, false});
        }
      }
      result.bytes_in = bytes_in;
    } catch (...) {
      fail(std::current_exception());
    }
  });

  try {
    auto batch = std::make_unique<Batch>();
    int64_t batch_bytes = 0;
    auto submit = [&] {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return failed || size_t(next_seq - written_seq) < max_in_flight; });
      if (failed) return false;
      batch->seq = next_seq++;
      batch->bytes_in = reader.bytes_read();
      todo.push_back(std::move(batch));
      cv.notify_all();
      batch = std::make_unique<Batch>();
      batch_bytes = 0;
      return true;
    };
    RawDocument doc;
    bool ok = true;
    while (ok && !failed && reader.next_raw(doc)) {
      batch_bytes += int64_t(doc.data.size());
      batch->docs.push_back(std::move(doc));
      if (batch_bytes >= (256 << 10) || batch->docs.size() >= 1024) ok = submit();
    }
    if (ok && !failed && !batch->docs.empty()) submit();
  } catch (...) {
    fail(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> lock(m);
    input_finished = true;
    cv.notify_all();
  }
  for (auto& t : pool) t.join();
  writer_thread.join();
  result.skipped_empty = reader.skipped_empty() + skipped_records;
  if (error) std::rethrow_exception(error);
  if (writer.docs() == 0)
    throw std::runtime_error("no documents found in the input (" + std::to_string(files.size()) + " files, " +
                             std::to_string(result.skipped_empty) + " empty documents)");
  finish_prep_result(writer, tok, opt.output_prefix, result);
  result.seconds = elapsed();
  if (progress) progress({result.docs, result.tokens, result.bytes_in, result.seconds, true});
  return result;
}

}  // namespace gpt
