// Directory conventions of checkpoints: names, durable atomic small-file writes, resolving what a load
// request points at, and pruning. Only complete directories (`iter_NNNNNNN` with metadata.yaml, renamed
// from `iter_NNNNNNN.tmp` after every rank's data was durable) are ever loaded or counted.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <regex>
#include <tuple>
#include <sstream>

#include "parallel/checkpoint/checkpoint_format.h"
#include "parallel/checkpoint/checkpoint_lock.h"

namespace gpt {

namespace fs = std::filesystem;

std::string iteration_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }
std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.h5", rank); }

void write_file_durably(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw CheckpointError("cannot create " + tmp + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      throw CheckpointError("cannot write " + tmp + ": " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    throw CheckpointError("fsync of " + tmp + " failed: " + std::strerror(err));
  }
  ::close(fd);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw CheckpointError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  fsync_path(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string());
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw CheckpointError("cannot read " + path);
  return s.str();
}

std::string random_token() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

namespace {

const std::regex& complete_name() {
  static const std::regex re("iter_([0-9]{1,18})");
  return re;
}

std::string trimmed(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

// The index of a complete checkpoint, or nothing when it cannot be read.
std::optional<CheckpointMeta> index_of(const fs::path& checkpoint) {
  try {
    const std::string path = (checkpoint / kMetadataFile).string();
    return checkpoint_meta_from_yaml(read_text_file(path), path);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::string printable(const std::string& text, size_t max) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  if (out.size() >= max && text.size() > max) out += "...";
  return out;
}

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (fs::exists(path, ec)) throw CheckpointError("checkpoint path " + path + " is not a directory");
    return "";
  }
  if (fs::exists(fs::path(path) / kMetadataFile, ec)) return path;
  const fs::path latest = fs::path(path) / kLatestFile;
  if (!fs::exists(latest, ec)) return "";
  const std::string name = trimmed(read_text_file(latest.string()));
  if (!std::regex_match(name, complete_name()))
    throw CheckpointError(latest.string() + " does not name a complete checkpoint directory iter_NNNNNNN (it holds '" +
                          printable(name) + "'); staging directories (.tmp) are never loaded. Write the name of a "
                          "complete iter_* directory into it, or delete it to resume from the newest complete one");
  const fs::path target = fs::path(path) / name;
  if (!fs::exists(target / kMetadataFile, ec))
    throw CheckpointError(latest.string() + " names " + name + ", but " + target.string() +
                          " has no metadata.yaml: it was deleted or is incomplete");
  return target.string();
}

std::vector<std::string> complete_checkpoints(const std::string& dir) {
  // (saved_at, iteration, path): the most recently committed first (the one `latest` last named), then by
  // iteration for indexes that do not record the time.
  std::vector<std::tuple<double, int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (entry.is_directory(ec) && std::regex_match(name, m, complete_name()) &&
        fs::exists(entry.path() / kMetadataFile, ec)) {
      const auto meta = index_of(entry.path());
      found.emplace_back(meta ? meta->saved_at : 0.0, std::stoll(m[1].str()), entry.path().string());
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(std::get<2>(f)));
  return out;
}

void remove_interrupted_saves(const std::string& dir, bool deletions) {
  static const std::regex staging("iter_[0-9]+\\.(tmp|deleting)"), tmp_only("iter_[0-9]+\\.tmp");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory() && std::regex_match(entry.path().filename().string(), deletions ? staging : tmp_only))
      fs::remove_all(entry.path(), ec);
  if (ec) throw CheckpointError("cannot list checkpoint directory " + dir + ": " + ec.message());
}

std::vector<std::string> prune_lineage(const std::string& dir, const std::string& newest, int64_t keep_last,
                                       std::vector<std::string>* notes, std::vector<std::string>* doomed_dirs) {
  std::vector<std::string> deleted;
  if (keep_last <= 0) return deleted;
  std::error_code ec;
  std::string latest;
  if (fs::exists(fs::path(dir) / kLatestFile, ec)) latest = trimmed(read_text_file((fs::path(dir) / kLatestFile).string()));
  // Walk the parent links from the newest; iterations strictly decrease along a lineage, which also
  // rules out cycles in a hand-edited index, and a parent whose id differs from the recorded one is a
  // directory of another lineage that took the name (after a rollback): the walk stops there.
  std::vector<std::string> chain;
  int64_t below = std::numeric_limits<int64_t>::max();
  std::string name = newest, expected_id;
  while (!name.empty()) {
    std::smatch m;
    if (!std::regex_match(name, m, complete_name())) break;
    const int64_t it = std::stoll(m[1].str());
    const fs::path path = fs::path(dir) / name;
    const auto meta = index_of(path);
    if (it >= below || !meta || (!expected_id.empty() && meta->id != expected_id)) break;
    below = it;
    chain.push_back(name);
    name = meta->parent;
    expected_id = meta->parent_id;
  }
  for (size_t i = static_cast<size_t>(keep_last); i < chain.size(); ++i) {
    if (chain[i] == latest) continue;
    // Renamed out of the complete names first, so a deletion cut short never leaves a directory that
    // looks complete; a failure is reported, not fatal: the new checkpoint is already committed.
    const fs::path from = fs::path(dir) / chain[i], doomed = fs::path(dir) / (chain[i] + ".deleting");
    fs::rename(from, doomed, ec);
    if (!ec && doomed_dirs) doomed_dirs->push_back(doomed.string());
    else if (!ec) fs::remove_all(doomed, ec);
    if (ec) {
      if (notes) notes->push_back("could not delete " + chain[i] + ": " + ec.message());
      ec.clear();
      continue;
    }
    deleted.push_back(chain[i]);
    if (notes) notes->push_back("deleted " + chain[i] + " (older than the newest checkpoint.keep_last of this lineage)");
  }
  return deleted;
}

std::string begin_checkpoint_dir(const std::string& dir, int64_t iteration, bool remove_deletions) {
  const fs::path tmp = fs::path(dir) / (iteration_dir_name(iteration) + ".tmp");
  require_lock_held_if_locked(dir);
  try {
    fs::create_directories(dir);
    remove_interrupted_saves(dir, remove_deletions);
    fs::create_directory(tmp);
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint " + dir + ": cannot create " + tmp.string() + ": " + e.what());
  }
  return tmp.string();
}

std::string commit_checkpoint_dir(const std::string& dir, const CheckpointMeta& meta, int64_t keep_last,
                                  std::vector<std::string>* notes, std::vector<std::string>* doomed) {
  const std::string name = iteration_dir_name(meta.iteration);
  const fs::path final_dir = fs::path(dir) / name;
  const fs::path tmp = fs::path(dir) / (name + ".tmp");
  try {
    require_lock_held_if_locked(dir);
    write_file_durably((tmp / kMetadataFile).string(), checkpoint_meta_to_yaml(meta));
    fsync_path(tmp.string());
    // The same iteration saved before by a lineage that was rolled back: keep it, under another name.
    // (Or by a save that stopped after its rename but before `latest` moved, which looks the same: never
    // overwriting is the safe reading of both.)
    if (fs::exists(final_dir)) {
      fs::path aside = fs::path(dir) / (name + ".abandoned");
      for (int k = 2; fs::exists(aside); ++k) aside = fs::path(dir) / fmt::format("{}.abandoned.{}", name, k);
      fs::rename(final_dir, aside);
      if (notes)
        notes->push_back(fmt::format("{} existed already (an abandoned lineage's, or an interrupted save's): kept as {}", name,
                                     aside.filename().string()));
    }
    fs::rename(tmp, final_dir);
    fsync_path(dir);
    write_file_durably((fs::path(dir) / kLatestFile).string(), name + "\n");
    prune_lineage(dir, name, keep_last, notes, doomed);
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint " + dir + ": committing " + name + ": " + e.what());
  }
  return final_dir.string();
}

}  // namespace gpt
