// Input expansion and document iteration for `gpt-train prep` (see document_reader.h). Files are read
// line by line, so inputs much larger than memory are fine; only a whole-file document is held at once.
// JSON records are decoded by data/json_lines, apart from the reading so that it can run in parallel.
#include "data/document_reader.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "data/json_lines.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_json_lines(const std::string& path) {
  return ends_with(path, ".jsonl") || ends_with(path, ".json") || ends_with(path, ".ndjson");
}

bool looks_binary(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char buf[8192];
  in.read(buf, sizeof buf);
  return std::find(buf, buf + in.gcount(), '\0') != buf + in.gcount();
}

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw std::runtime_error("no --input files given");
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    auto st = fs::status(in, ec);
    if (ec || !fs::exists(st)) throw std::runtime_error("input '" + in + "' does not exist");
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(in)) {
        if (e.is_symlink() || !e.is_regular_file() || looks_binary(e.path())) continue;
        found.push_back(e.path().string());
      }
      if (found.empty()) throw std::runtime_error("input directory '" + in + "' holds no text files");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(in);
    }
  }
  return files;
}

DocumentReader::DocumentReader(std::vector<std::string> files, DocumentReaderOptions options)
    : files_(std::move(files)), opt_(std::move(options)) {}

bool DocumentReader::open_next_file() {
  if (file_index_ >= files_.size()) return false;
  current_ = files_[file_index_++];
  in_ = std::make_unique<std::ifstream>(current_, std::ios::binary);
  if (!*in_) throw std::runtime_error("input '" + current_ + "' cannot be opened");
  json_ = is_json_lines(current_);
  whole_file_done_ = false;
  line_no_ = 0;
  return true;
}

bool DocumentReader::next(std::string& doc) {
  RawDocument raw;
  while (next_raw(raw)) {
    doc = text(std::move(raw));
    if (!doc.empty()) return true;
    ++empty_;
  }
  return false;
}

bool DocumentReader::next_raw(RawDocument& doc) {
  while (true) {
    if (!in_ && !open_next_file()) return false;
    if (next_from_current(doc)) {
      if (doc.json || !doc.data.empty()) return true;
      ++empty_;
      continue;
    }
    if (in_->bad()) throw std::runtime_error("input '" + current_ + "' could not be read");
    in_.reset();
  }
}

std::string DocumentReader::text(RawDocument&& doc) const {
  if (!doc.json) return std::move(doc.data);
  try {
    return json_string_field(doc.data, opt_.json_key);
  } catch (const JsonError& e) {
    throw std::runtime_error("input '" + files_[doc.file] + "' line " + std::to_string(doc.line) + ": " + e.what());
  }
}

// One document (possibly empty) from the open file; false when the file is exhausted.
bool DocumentReader::next_from_current(RawDocument& raw) {
  raw.json = json_;
  raw.file = file_index_ - 1;
  raw.line = 0;
  std::string& doc = raw.data;
  doc.clear();
  std::string line;
  if (json_) {
    while (std::getline(*in_, doc)) {
      ++line_no_;
      bytes_ += int64_t(doc.size()) + 1;
      if (is_blank(doc)) continue;
      raw.line = line_no_;
      return true;
    }
    return false;
  }
  if (!opt_.doc_separator) {
    if (whole_file_done_) return false;
    std::ostringstream ss;
    ss << in_->rdbuf();
    doc = ss.str();
    bytes_ += int64_t(doc.size());
    whole_file_done_ = true;
    return true;
  }
  const std::string& sep = *opt_.doc_separator;
  bool any = false;
  while (std::getline(*in_, line)) {
    any = true;
    ++line_no_;
    bool had_newline = !in_->eof();
    bytes_ += int64_t(line.size()) + (had_newline ? 1 : 0);
    std::string bare = (!line.empty() && line.back() == '\r') ? line.substr(0, line.size() - 1) : line;
    if (sep.empty() ? is_blank(line) : bare == sep) return true;
    doc += line;
    if (had_newline) doc += '\n';
  }
  return any;
}

}  // namespace gpt
