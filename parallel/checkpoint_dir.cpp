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
#include <regex>
#include <sstream>

#include "parallel/checkpoint_format.h"

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

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (fs::exists(path, ec)) throw CheckpointError("checkpoint path " + path + " is not a directory");
    return "";
  }
  if (fs::exists(fs::path(path) / kMetadataFile, ec)) return path;
  const fs::path latest = fs::path(path) / kLatestFile;
  if (!fs::exists(latest, ec)) return "";
  std::string name = read_text_file(latest.string());
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
    throw CheckpointError(latest.string() + " does not name a checkpoint directory (it holds '" + name + "')");
  const fs::path target = fs::path(path) / name;
  // A save that replaced an existing iteration and stopped between its two renames left the old copy
  // set aside; it is complete, and it is what `latest` meant.
  const fs::path set_aside = fs::path(path) / (name + ".replaced");
  if (!fs::exists(target / kMetadataFile, ec) && fs::exists(set_aside / kMetadataFile, ec)) return set_aside.string();
  if (!fs::exists(target / kMetadataFile, ec))
    throw CheckpointError(latest.string() + " names " + name + ", but " + target.string() +
                          " has no metadata.yaml: it was deleted or is incomplete");
  return target.string();
}

void prune_checkpoints(const std::string& dir, int64_t keep_last) {
  static const std::regex complete("iter_([0-9]+)");
  static const std::regex leftover("iter_[0-9]+\\.(tmp|replaced)");
  std::error_code ec;
  std::string latest;
  if (fs::exists(fs::path(dir) / kLatestFile, ec)) {
    latest = read_text_file((fs::path(dir) / kLatestFile).string());
    while (!latest.empty() && std::isspace(static_cast<unsigned char>(latest.back()))) latest.pop_back();
  }
  std::vector<std::pair<int64_t, fs::path>> saved;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, leftover)) {
      fs::remove_all(entry.path(), ec);
    } else if (std::regex_match(name, m, complete) && fs::exists(entry.path() / kMetadataFile)) {
      saved.emplace_back(std::stoll(m[1].str()), entry.path());
    }
  }
  if (ec) throw CheckpointError("cannot list checkpoint directory " + dir + ": " + ec.message());
  if (keep_last <= 0) return;
  std::sort(saved.begin(), saved.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep_last); i < saved.size(); ++i) {
    if (saved[i].second.filename().string() == latest) continue;
    fs::remove_all(saved[i].second, ec);
    if (ec) throw CheckpointError("cannot delete old checkpoint " + saved[i].second.string() + ": " + ec.message());
  }
}

std::string begin_checkpoint_dir(const std::string& dir, int64_t iteration) {
  const fs::path tmp = fs::path(dir) / (iteration_dir_name(iteration) + ".tmp");
  try {
    fs::create_directories(dir);
    prune_checkpoints(dir, 0);
    fs::create_directory(tmp);
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint " + dir + ": cannot create " + tmp.string() + ": " + e.what());
  }
  return tmp.string();
}

std::string commit_checkpoint_dir(const std::string& dir, const CheckpointMeta& meta, int64_t keep_last) {
  const std::string name = iteration_dir_name(meta.iteration);
  const fs::path final_dir = fs::path(dir) / name;
  const fs::path tmp = fs::path(dir) / (name + ".tmp");
  try {
    write_file_durably((tmp / kMetadataFile).string(), checkpoint_meta_to_yaml(meta));
    fsync_path(tmp.string());
    // Saving an iteration that exists already (training again from an earlier checkpoint): set the old
    // one aside first, as rename cannot replace a non-empty directory.
    if (fs::exists(final_dir)) fs::rename(final_dir, fs::path(dir) / (name + ".replaced"));
    fs::rename(tmp, final_dir);
    fsync_path(dir);
    write_file_durably((fs::path(dir) / kLatestFile).string(), name + "\n");
    prune_checkpoints(dir, keep_last);
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint " + dir + ": committing " + name + ": " + e.what());
  }
  return final_dir.string();
}

}  // namespace gpt
