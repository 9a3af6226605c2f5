// The `gpt-train prep` subcommand around data/prep_pipeline: the progress display (documents, tokens, MB/s
// on stderr: one rewritten line on a terminal, a line every few seconds otherwise) and the closing
// summary. Its flags are defined with the other subcommands' in app/cli_subcommands.cpp.
#include "app/prep.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "data/prep_pipeline.h"

namespace gpt {

namespace {

std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

}  // namespace

int prep_main(const PrepOptions& opt) {
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
