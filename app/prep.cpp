// The `gpt-train prep` subcommand: its option parsing (self-contained, since --input takes several
// files), the progress display (documents, tokens, MB/s on stderr: one rewritten line on a terminal,
// a line every few seconds otherwise) and the closing summary. The work is data/prep_pipeline.
#include "app/prep.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>

#include "data/prep_pipeline.h"

namespace gpt {

namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int64_t to_int(const std::string& name, const std::string& v) {
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') throw UsageError("--" + name + " expects an integer, got '" + v + "'");
  return x;
}

double to_double(const std::string& name, const std::string& v) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') throw UsageError("--" + name + " expects a number, got '" + v + "'");
  return x;
}

// --name value, --name=value; --input takes every following word up to the next option.
PrepOptions parse(const std::vector<std::string>& args, bool& help) {
  PrepOptions o;
  static const std::map<std::string, bool> known = {
      {"input", true},      {"from-megatron", true}, {"output-prefix", true}, {"tokenizer", true},
      {"vocab-file", true}, {"merges-file", true},   {"vocab-size", true},    {"shard-tokens", true},
      {"shard-mb", true},   {"workers", true},       {"doc-separator", true}, {"json-key", true},
      {"help", false}};
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "-h") a = "--help";
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    auto k = known.find(name);
    if (k == known.end()) throw UsageError("unknown option --" + name);
    if (!k->second) {
      help = true;
      continue;
    }
    if (name == "input") {
      if (inline_value) o.inputs.push_back(value);
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) o.inputs.push_back(args[++i]);
      if (o.inputs.empty()) throw UsageError("--input needs at least one file");
      continue;
    }
    if (!inline_value) {
      // A value may itself start with "--" only through --name=value; an empty one is allowed.
      if (i + 1 >= args.size()) throw UsageError("--" + name + " needs a value");
      value = args[++i];
    }
    if (name == "from-megatron") o.from_megatron = value;
    else if (name == "output-prefix") o.output_prefix = value;
    else if (name == "tokenizer") o.tokenizer = value;
    else if (name == "vocab-file") o.vocab_file = value;
    else if (name == "merges-file") o.merges_file = value;
    else if (name == "vocab-size") o.vocab_size = to_int(name, value);
    else if (name == "shard-tokens") o.shard_tokens = to_int(name, value);
    else if (name == "shard-mb") o.shard_mb = to_double(name, value);
    else if (name == "workers") o.workers = int(to_int(name, value));
    else if (name == "doc-separator") o.doc_separator = value;
    else if (name == "json-key") o.json_key = value;
  }
  if (help) return o;
  if (!o.from_megatron.empty() && !o.inputs.empty())
    throw UsageError("--from-megatron and --input exclude each other: convert a Megatron dataset or tokenize text");
  if (o.inputs.empty() && o.from_megatron.empty()) throw UsageError("--input (or --from-megatron) is required");
  if (o.output_prefix.empty()) throw UsageError("--output-prefix is required");
  if (o.shard_tokens < 0 || !(o.shard_mb > 0)) throw UsageError("--shard-tokens / --shard-mb must be positive");
  if (o.workers < 0) throw UsageError("--workers must be >= 0");
  return o;
}

std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

}  // namespace

std::string prep_usage() {
  return R"(usage: gpt-train prep --input FILE|DIR... --output-prefix P [options]
       gpt-train prep --from-megatron PREFIX --tokenizer KIND --output-prefix P [options]

Tokenizes text into HDF5 shards P_00000.h5, P_00001.h5, ... and the index P.index.json that
data.train / data.valid name as P. An end-of-document token follows every document.

  --input FILE|DIR...    .jsonl/.json/.ndjson: one JSON object per line with a "text" field;
                         anything else: plain text; a directory: its regular non-binary files
  --from-megatron PREFIX instead of --input: convert Megatron-LM's indexed dataset PREFIX.bin +
                         PREFIX.idx, already tokenized with the --tokenizer given (its files do not
                         say which); documents kept, end-of-document appended where missing
  --output-prefix P      output path prefix (directories are created)
  --tokenizer KIND       bytes (default; vocab 257) | gpt2 | spm
  --vocab-file F         gpt2: vocab.json; spm: an existing SentencePiece .model
  --merges-file F        gpt2: merges.txt
  --vocab-size N         spm without --vocab-file: train a byte-fallback BPE of N pieces on the
                         input first and save it as P.spm.model
  --shard-tokens N       tokens per shard (a shard ends at the first document boundary past N)
  --shard-mb M           or: megabytes of stored tokens per shard (default 64)
  --workers N            tokenizer threads (default: one per hardware thread)
  --doc-separator LINE   plain text: a line equal to LINE ends a document (e.g. % for fortune
                         files; '' = blank lines); default: each file is one document
  --json-key K           JSON field holding the text (default text)
)";
}

int prep_main(const std::vector<std::string>& args) {
  PrepOptions opt;
  bool help = false;
  try {
    opt = parse(args, help);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gpt-train prep: %s (see gpt-train prep --help)\n", e.what());
    return 2;
  }
  if (help) {
    std::cout << prep_usage();
    return 0;
  }
  const bool tty = ::isatty(STDERR_FILENO);
  double last_line = 0;
  auto show = [&](const PrepProgress& p) {
    if (!tty && !p.done && p.seconds - last_line < 5) return;
    last_line = p.seconds;
    double mbps = p.seconds > 0 ? double(p.bytes_in) / 1048576.0 / p.seconds : 0;
    std::fprintf(stderr, "%sprep: %s docs  %s tokens  %.1f MB read  %.1f MB/s%s", tty ? "\r" : "",
                 human(double(p.docs)).c_str(), human(double(p.tokens)).c_str(), double(p.bytes_in) / 1048576.0,
                 mbps, tty && !p.done ? "   " : "\n");
    std::fflush(stderr);
  };
  try {
    if (opt.tokenizer == "spm" && opt.vocab_file.empty())
      std::fprintf(stderr, "prep: training a SentencePiece BPE of %lld pieces on the input...\n",
                   static_cast<long long>(opt.vocab_size));
    PrepResult r = run_prep(opt, show);
    double mbps = r.seconds > 0 ? double(r.bytes_in) / 1048576.0 / r.seconds : 0;
    if (!r.tokenizer_model.empty())
      std::printf("trained %s in %.1f s: %s\n", r.tokenizer.c_str(), r.train_seconds, r.tokenizer_model.c_str());
    std::printf("wrote %zu shard(s), %lld documents, %lld tokens (%s, vocab %lld, eod %lld) in %.2f s: "
                "%.1f MB/s of %s\n",
                r.shards.size(), static_cast<long long>(r.docs), static_cast<long long>(r.tokens), r.tokenizer.c_str(),
                static_cast<long long>(r.vocab_size), static_cast<long long>(r.eod_id), r.seconds, mbps,
                opt.from_megatron.empty() ? "text" : ".bin");
    if (!opt.from_megatron.empty())
      std::printf("appended the end-of-document id to %lld of %lld documents (they did not end with it)\n",
                  static_cast<long long>(r.eod_appended), static_cast<long long>(r.docs));
    if (r.skipped_empty) std::printf("skipped %lld empty documents\n", static_cast<long long>(r.skipped_empty));
    std::printf("unigram perplexity of the corpus: %.2f (the no-context baseline)\n", r.unigram_perplexity);
    std::printf("index: %s  (use data.train: [%s])\n", r.index.c_str(), opt.output_prefix.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%sgpt-train prep: error: %s\n", tty ? "\n" : "", e.what());
    return 1;
  }
}

}  // namespace gpt
