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

class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, DocumentReaderOptions options);
  // The next non-empty document; false at the end. Throws naming file:line for a malformed JSON line.
  bool next(std::string& doc);
  int64_t bytes_read() const { return bytes_; }   // input bytes consumed so far
  int64_t skipped_empty() const { return empty_; }  // documents without any text

 private:
  bool open_next_file();
  bool next_from_current(std::string& doc);
  std::vector<std::string> files_;
  DocumentReaderOptions opt_;
  size_t file_index_ = 0;
  std::unique_ptr<std::ifstream> in_;
  std::string current_;
  bool json_ = false, whole_file_done_ = false;
  int64_t line_no_ = 0, bytes_ = 0, empty_ = 0;
};

}  // namespace gpt
