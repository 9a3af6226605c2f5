// Distributed load (see checkpoint.h; saving is in checkpoint_save.cpp): rank 0's validation broadcast,
// each rank's reads for its own layout, and the error agreement that turns a failure on any rank into the
// same exception on every rank.
#include "parallel/checkpoint/checkpoint.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "parallel/checkpoint/checkpoint_fp8.h"
#include "parallel/comm/host_messages.h"

namespace gpt {

namespace fs = std::filesystem;

void agree_on_checkpoint(Communicator& comm, const std::string& error) {
  agree_or_throw<CheckpointError>(comm, error);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

bool compatible_shapes(const std::string& name, const Shape& saved, const Shape& current, int64_t vocab) {
  if (saved == current) return true;
  // The padded vocabulary depends on the tensor-parallel degree; only the real rows have to exist.
  const bool vocab_rows = name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
  return vocab_rows && saved.size() == 2 && current.size() == 2 && saved[1] == current[1] && saved[0] >= vocab &&
         current[0] >= vocab;
}

void load_tensors(const std::string& dir, const CheckpointMeta& meta, const CheckpointModel& m, int64_t& bytes) {
  CheckpointReader reader(dir, meta);
  // Which stored data no other rank of this layout reads: the optimizer state when it is not replicated
  // over data parallelism, the weights when there is no data parallelism. (Tensor-parallel replicas and
  // the tied embedding are the exceptions; re-reading them costs little.)
  const ParallelState& ps = *m.ps;
  if (ps.dp_size() == 1) reader.drop_after_reading({"model", "master", "adam_m", "adam_v"});
  else if (m.optimizer->distributed()) reader.drop_after_reading({"master", "adam_m", "adam_v"});
  Backend& be = *m.backend;
  // The fp32 truth is the master copy when one was stored. Values come from the stored compute-dtype
  // values when the dtype is unchanged (exact), else from that fp32 truth, rounded on upload.
  const std::string master_kind = meta.master_weights ? "master" : "model";
  const std::string value_kind = meta.dtype == m.dtype ? "model" : master_kind;
  std::vector<float> host;
  auto load = [&](const std::string& kind, const Parameter& p, int64_t begin, int64_t end, Tensor& dst, bool zeros) {
    const int64_t n = end - begin;
    const int64_t expected = count_below(p.global_shape, p.shard, begin, end, shape_numel(meta.tensors.at(p.name)));
    // fp32 host tensors are filled in place; others through host fp32 and an upload (which rounds).
    const bool in_place = dst.device() == Device::CPU && dst.dtype() == DType::F32;
    if (!in_place) host.resize(n);
    float* out = in_place ? dst.f32() : host.data();
    // Rows the checkpoint never had (more vocabulary padding here) keep the initialiser's values, or
    // start at zero for the moments.
    if (expected < n) {
      if (zeros)
        std::fill(out, out + n, 0.f);
      else if (!in_place)
        be.download(dst, out);
    }
    const int64_t got = reader.read(kind, p.name, p.global_shape, p.shard, begin, end, out);
    if (got != expected)
      throw CheckpointError(fmt::format(
          "checkpoint {}: tensor {} ({}): the rank files hold {} of the {} elements this rank needs (local range "
          "[{}, {})); the index is incomplete",
          dir, p.name, kind, got, expected, begin, end));
    if (!in_place) be.upload(out, dst);
  };
  for (ModelChunk* c : m.chunks)
    for (auto& p : c->params().params()) load(value_kind, *p, 0, p->value.numel(), p->value, false);
  for (OptimizerSegment& s : m.optimizer->adam().segments()) {
    auto [begin, end] = segment_range(s);
    if (s.master.raw() != s.value.raw()) load(master_kind, *s.param, begin, end, s.master, false);
    if (meta.has_optimizer_state && m.load_optimizer_state) {
      load("adam_m", *s.param, begin, end, s.m, true);
      load("adam_v", *s.param, begin, end, s.v, true);
    } else {
      be.fill(s.m, 0.f);
      be.fill(s.v, 0.f);
    }
  }
  // FP8 scales: each entry the checkpoint has for this rank's layers (none: they start at 1).
  std::vector<float> stored;
  for (ModelChunk* c : m.chunks)
    for (Fp8TensorScale* s : c->fp8_scales().all()) {
      auto it = meta.tensors.find(s->name);
      if (it == meta.tensors.end()) continue;
      stored.assign(static_cast<size_t>(shape_numel(it->second)), 0.f);
      const int64_t n = static_cast<int64_t>(stored.size());
      if (reader.read("fp8", s->name, it->second, ShardSpec{}, 0, n, stored.data()) != n)
        throw CheckpointError(fmt::format("checkpoint {}: FP8 state {}: the rank files do not hold its {} values", dir,
                                          s->name, n));
      unpack_fp8_scale(stored, c->fp8_scales().recipe(), *s, dir);
    }
  bytes = reader.bytes_read();
}

// Reads every piece of a checkpoint once, checking each against the CRC-32 in the index.
void verify_checkpoint_data(const std::string& dir, const CheckpointMeta& meta) {
  CheckpointReader reader(dir, meta);
  std::vector<float> buffer;
  for (const StoredFile& f : meta.files)
    for (const StoredPiece& p : f.pieces) {
      auto shape = meta.tensors.find(p.name);
      if (shape == meta.tensors.end())
        throw CheckpointError(fmt::format("checkpoint {}: {} holds a piece of {}, which the index's tensors lack", dir,
                                          f.file, p.name));
      buffer.resize(static_cast<size_t>(p.end - p.begin));
      reader.read(p.kind, p.name, shape->second, p.shard, p.begin, p.end, buffer.data());
    }
}

// With no `latest` pointer: the newest complete checkpoint in `dir` whose index, rank files and
// checksums all verify (the pointer is lost when, say, the disk filled while it was rewritten). `note`
// says what happened, for the log. Empty when there is no complete checkpoint at all; an error when there
// are some but none verifies.
std::string newest_verified_checkpoint(const std::string& dir, const CheckpointModel& m, std::string& note) {
  std::vector<std::string> rejected;
  for (const std::string& candidate : complete_checkpoints(dir)) {
    try {
      const std::string index = (fs::path(candidate) / kMetadataFile).string();
      const CheckpointMeta meta = checkpoint_meta_from_yaml(read_text_file(index), index);
      if (iteration_dir_name(meta.iteration) != fs::path(candidate).filename().string())
        throw CheckpointError(fmt::format("its index says iteration {}", meta.iteration));
      validate_checkpoint(candidate, meta, m);
      verify_checkpoint_data(candidate, meta);
      note = fmt::format("{}/{} is missing: resuming from the most recently saved complete checkpoint, {} (index, "
                         "rank files and checksums verified)",
                         dir, kLatestFile, fs::path(candidate).filename().string());
      for (const std::string& r : rejected) note += "; skipped " + r;
      for (char& c : note)
        if (c == '\n') c = ' ';  // the note travels as one line
      return candidate;
    } catch (const std::exception& e) {
      rejected.push_back(fs::path(candidate).filename().string() + " (" + e.what() + ")");
      if (rejected.size() >= 8) break;  // enough to act on; older ones are not read
    }
  }
  if (rejected.empty()) return "";
  std::string list;
  for (const std::string& r : rejected) list += "\n  " + r;
  throw CheckpointError(fmt::format("{}/{} is missing and no complete checkpoint in {} verifies:{}", dir, kLatestFile,
                                    dir, list));
}

}  // namespace

std::pair<int64_t, int64_t> segment_range(const OptimizerSegment& s) {
  const int64_t begin = s.grad.f32() - s.param->grad.f32();
  return {begin, begin + s.grad.numel()};
}

void validate_checkpoint(const std::string& dir, const CheckpointMeta& meta, const CheckpointModel& m) {
  std::vector<std::string> problems = model_config_differences(meta.config_yaml, m.config_yaml, m.default_config_yaml);
  for (const auto& [name, shape] : m.global_shapes) {
    auto it = meta.tensors.find(name);
    if (it == meta.tensors.end())
      problems.push_back("tensor " + name + " " + shape_str(shape) + ": not in the checkpoint");
    else if (!compatible_shapes(name, it->second, shape, m.vocab_size))
      problems.push_back(fmt::format("tensor {}: checkpoint shape {}, model shape {}", name, shape_str(it->second),
                                     shape_str(shape)));
  }
  for (const auto& [name, shape] : meta.tensors)
    if (!m.global_shapes.count(name) && !is_fp8_state_name(name)) problems.push_back("tensor " + name + ": in the checkpoint but not in this model");
  if (!problems.empty()) {
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 12; ++i) list += "\n  " + problems[i];
    if (problems.size() > 12) list += fmt::format("\n  ... and {} more", problems.size() - 12);
    throw CheckpointError("checkpoint " + dir + " does not match this model:" + list);
  }
  for (const StoredFile& f : meta.files) {
    const fs::path path = fs::path(dir) / f.file;
    std::error_code ec;
    if (!fs::exists(path, ec))
      throw CheckpointError(fmt::format("checkpoint {}: rank file {} (written by rank {}) is missing", dir, f.file,
                                        f.rank));
    const auto size = static_cast<int64_t>(fs::file_size(path, ec));
    if (ec) throw CheckpointError("checkpoint " + dir + ": cannot read the size of " + path.string());
    if (size != f.bytes)
      throw CheckpointError(fmt::format("checkpoint {}: rank file {} is {} bytes but was {} bytes when saved ({})",
                                        dir, f.file, size, f.bytes, size < f.bytes ? "truncated" : "modified"));
  }
}

std::optional<CheckpointLoadReport> load_distributed_checkpoint(const std::string& path, bool required,
                                                                const CheckpointModel& m) {
  const auto t0 = std::chrono::steady_clock::now();
  Communicator& world = *m.ps->world;
  // Rank 0 decides for everyone: 'N' nothing to load, 'E' + error, 'O' + directory + '\n' + note + '\n' +
  // index text.
  std::string message;
  if (world.rank() == 0) {
    try {
      std::string dir = resolve_checkpoint(path), note;
      if (dir.empty()) {
        std::error_code ec;
        if (fs::is_directory(path, ec)) dir = newest_verified_checkpoint(path, m, note);
      }
      if (dir.empty()) {
        if (required)
          throw CheckpointError("checkpoint " + path + ": nothing to load (no metadata.yaml and no latest pointer)");
        message.assign(1, 'N');
      } else {
        const std::string index = (fs::path(dir) / kMetadataFile).string();
        const std::string text = read_text_file(index);
        validate_checkpoint(dir, checkpoint_meta_from_yaml(text, index), m);
        message = "O" + dir + "\n" + note + "\n" + text;
      }
    } catch (const std::exception& e) {
      message = std::string("E") + e.what();
    }
  }
  message = broadcast_string(world, message, 0);
  if (message.empty() || message[0] == 'E') throw CheckpointError(message.empty() ? "checkpoint: no answer" : message.substr(1));
  if (message[0] == 'N') return std::nullopt;

  CheckpointLoadReport report;
  const size_t newline = message.find('\n'), second = message.find('\n', newline + 1);
  report.path = message.substr(1, newline - 1);
  report.note = message.substr(newline + 1, second - newline - 1);
  report.meta = checkpoint_meta_from_yaml(message.substr(second + 1), report.path + "/" + kMetadataFile);
  std::string error;
  int64_t bytes = 0;
  try {
    load_tensors(report.path, report.meta, m, bytes);
  } catch (const std::exception& e) {
    error = rank_prefix(world) + e.what();
  }
  agree_on_checkpoint(world, error);
  double total = static_cast<double>(bytes);
  world.all_reduce_host(&total, 1);
  report.bytes_read = static_cast<int64_t>(total);
  report.seconds = seconds_since(t0);
  return report;
}

}  // namespace gpt
