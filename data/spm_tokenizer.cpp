// SentencePiece tokenizer: a BPE model trained on the corpus itself (with byte fallback, so every input
// byte stays representable) or loaded from a .model file. The library does the training and encoding;
// this file fixes the options that make it a faithful byte-preserving tokenizer for pre-training data
// (identity normalization, no whitespace folding, no dummy prefix) and maps its errors to exceptions.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <unordered_map>

#include "data/tokenizer.h"

namespace gpt {

namespace {

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(const std::string& path) : path_(path) {
    std::string bytes = read_file_bytes(path, "SentencePiece model");
    hash_ = "fnv1a64:" + hex64(fnv1a64(bytes));
    auto status = processor_.LoadFromSerializedProto(bytes);
    if (!status.ok())
      throw std::runtime_error("SentencePiece model '" + path + "' cannot be loaded: " + status.ToString());
    if (processor_.eos_id() < 0)
      throw std::runtime_error("SentencePiece model '" + path + "' has no </s> piece to end documents with");
  }

  std::string name() const override { return "spm"; }
  std::string hash() const override { return hash_; }
  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  int64_t eod_id() const override { return processor_.eos_id(); }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<int> ids;
    auto status = processor_.Encode(text, &ids);
    if (!status.ok()) throw std::runtime_error("SentencePiece model '" + path_ + "': " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> v;
    for (int32_t id : ids)
      if (id >= 0 && id < processor_.GetPieceSize() && id != processor_.eos_id()) v.push_back(id);
    std::string out;
    auto status = processor_.Decode(v, &out);
    if (!status.ok()) throw std::runtime_error("SentencePiece model '" + path_ + "': " + status.ToString());
    return out;
  }

 private:
  std::string path_, hash_;
  sentencepiece::SentencePieceProcessor processor_;
};

class VectorSentences final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorSentences(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return s_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& s_;
  size_t i_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(const std::string& model_file) {
  return std::make_unique<SpmTokenizer>(model_file);
}

void train_spm_model(const std::vector<std::string>& sentences, int64_t vocab_size, int threads,
                     const std::string& model_file) {
  if (vocab_size < 260 || vocab_size > (int64_t(1) << 31) - 1)
    throw std::runtime_error("--vocab-size " + std::to_string(vocab_size) +
                             " is too small for a byte-fallback BPE (needs at least 260: 256 bytes + 3 controls + 1)");
  if (sentences.empty()) throw std::runtime_error("no text to train the SentencePiece model on");
  std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"hard_vocab_limit", "false"},
      {"max_sentence_length", "16384"},
      {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(std::max(1, threads))},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", "2"},
  };
  VectorSentences it(sentences);
  std::string proto;
  auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  if (!status.ok()) throw std::runtime_error("SentencePiece training failed: " + status.ToString());
  std::string tmp = model_file + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(proto.data(), std::streamsize(proto.size()));
    if (!out) throw std::runtime_error("cannot write SentencePiece model '" + tmp + "'");
  }
  std::filesystem::rename(tmp, model_file);
}

}  // namespace gpt
