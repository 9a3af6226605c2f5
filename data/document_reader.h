// Reads the documents that `gpt-train prep` tokenizes. JSON-lines files (.jsonl, .json, .ndjson) hold one
// document per line in a string field ("text" by default). Plain text files are one document each, or,
// with a separator, split at every line equal to it (e.g. "%" for fortune files; "" splits at blank
// lines). A directory stands for the regular files directly inside it, in name order, skipping symlinks
// and binary files (a NUL byte in the first 8 KiB).
#pragma once
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpt {

struct DocumentReaderOptions {
  std::optional<std::string> doc_separator;  // plain text only; nullopt = whole file is one document
  std::string json_key = "text";
};

// The input files named by `inputs` (files, or directories expanded as above). Throws
// std::runtime_error naming an input that does not exist or a directory with no usable file.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

// A document as read, before its JSON is decoded: for a JSON-lines file the line that holds it (decoded
// by DocumentReader::text, so that several threads can decode while one reads), else its text.
struct RawDocument {
  std::string data;
  bool json = false;
  size_t file = 0;   // index into the reader's files
  int64_t line = 0;  // 1-based line number of a JSON-lines record
};

class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, DocumentReaderOptions options);
  // The next non-empty document; false at the end. Throws naming file:line for a malformed JSON line.
  bool next(std::string& doc);
  // The next document with its JSON not yet decoded; false at the end. Empty plain-text documents are
  // skipped and counted here; a JSON record's text may still turn out empty (the caller counts those).
  bool next_raw(RawDocument& doc);
  // The text of `doc` (moved out of it); decodes a JSON record, throwing std::runtime_error naming the
  // file and line when it is malformed. Safe to call from several threads at once.
  std::string text(RawDocument&& doc) const;
  int64_t bytes_read() const { return bytes_; }   // input bytes consumed so far
  int64_t skipped_empty() const { return empty_; }  // documents without any text (raw: plain text only)

 private:
  bool open_next_file();
  bool next_from_current(RawDocument& doc);
  std::vector<std::string> files_;
  DocumentReaderOptions opt_;
  size_t file_index_ = 0;
  std::unique_ptr<std::ifstream> in_;
  std::string current_;
  bool json_ = false, whole_file_done_ = false;
  int64_t line_no_ = 0, bytes_ = 0, empty_ = 0;
};

}  // namespace gpt
