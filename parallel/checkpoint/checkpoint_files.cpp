// HDF5 rank files of a checkpoint: ShardFileWriter stores pieces as 1-D datasets `/<kind>/<global name>`
// (attributes repeat the global shape, shard and range so h5dump/h5py users can place them without the
// index), CheckpointReader reads whole pieces, checks each against the CRC-32 in the index, and copies
// the elements a reader's own shard needs. Files use the HDF5 1.10 format, whose metadata is checksummed,
// so damage outside the raw data fails at open; damage inside it fails the CRC. bf16 and fp16 are stored
// as HDF5 custom float types, so standard tools see real floating-point numbers.
// Page cache: checkpoint data passes through once, so the writer starts writeback of each dataset as
// soon as it is written and drops what is on disk every 64 MB (a bounded amount of dirty memory: a
// plain write-then-fsync of many GB is several times slower on a VM), and the reader drops pieces that
// no other rank of this layout reads (set by the caller).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <fmt/format.h>

#include "data/hdf5_util.h"
#include "model/ops/half.h"
#include "parallel/checkpoint/checkpoint_format.h"

namespace gpt {

namespace {

// The HDF5 type a stored dtype is written as (and read back as, so reads never convert).
h5::Handle file_type(DType t, const std::string& file) {
  if (t == DType::F32) return h5::check(H5Tcopy(H5T_IEEE_F32LE), file, "create float type");
  h5::Handle type = h5::check(H5Tcopy(H5T_IEEE_F32LE), file, "create 16-bit float type");
  // Sign bit 15; bf16: 8 exponent bits at 7, 7 mantissa bits, bias 127; fp16: 5 at 10, 10 bits, bias 15.
  const bool bf16 = t == DType::BF16;
  h5::check(H5Tset_fields(type.get(), 15, bf16 ? 7 : 10, bf16 ? 8 : 5, 0, bf16 ? 7 : 10), file, "set float fields");
  h5::check(H5Tset_size(type.get(), 2), file, "set float size");
  h5::check(H5Tset_ebias(type.get(), bf16 ? 127 : 15), file, "set exponent bias");
  return type;
}

void write_int_attr(hid_t obj, const char* name, const std::vector<int64_t>& v, const std::string& file) {
  hsize_t n = v.size();
  h5::Handle space = h5::check(H5Screate_simple(1, &n, nullptr), file, "create attribute space");
  h5::Handle attr = h5::check(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), file,
                              std::string("create attribute ") + name);
  h5::check(H5Awrite(attr.get(), H5T_NATIVE_INT64, v.data()), file, std::string("write attribute ") + name);
}

// The POSIX descriptor under an HDF5 file opened with the default (sec2) driver; -1 otherwise.
int posix_fd(hid_t file) {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || !handle) return -1;
  return *static_cast<int*>(handle);
}

}  // namespace

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw CheckpointError("cannot open " + path + " to flush it to disk: " + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw CheckpointError("fsync of " + path + " failed: " + std::strerror(err));
}

// ---- writer ----

struct ShardFileWriter::Impl {
  std::string path;
  h5::Handle file;
  int fd = -1;
  int64_t on_disk = 0;  // file bytes below this offset are written back and dropped from the cache
  std::map<std::string, h5::Handle> groups;
  StoredFile entry;
};

ShardFileWriter::ShardFileWriter(const std::string& path, int rank, int64_t iteration) : impl_(std::make_unique<Impl>()) {
  h5::Lock lock;
  impl_->path = path;
  impl_->entry.file = std::filesystem::path(path).filename().string();
  impl_->entry.rank = rank;
  impl_->file = h5::create_file(path);
  impl_->fd = posix_fd(impl_->file.get());
  write_int_attr(impl_->file.get(), "rank", {rank}, path);
  write_int_attr(impl_->file.get(), "iteration", {iteration}, path);
}

ShardFileWriter::~ShardFileWriter() {
  h5::Lock lock;
  impl_.reset();
}

void ShardFileWriter::write(const std::string& kind, const std::string& name, const Shape& global,
                            const ShardSpec& shard, int64_t begin, int64_t end, const float* values, DType dtype,
                            const std::atomic<bool>* cancel) {
  Impl& w = *impl_;
  const std::string where = w.path + " " + kind + "/" + name;
  const hsize_t n = static_cast<hsize_t>(end - begin);
  if (end <= begin) throw CheckpointError(where + ": empty piece");
  const size_t elem = dtype == DType::F32 ? 4 : 2;
  StoredPiece piece{kind, name, shard, begin, end, dtype, crc32_bytes(nullptr, 0)};  // the CRC of nothing
  h5::Handle ds, type;
  {
    h5::Lock lock;
    auto g = w.groups.find(kind);
    if (g == w.groups.end())
      g = w.groups
              .emplace(kind, h5::check(H5Gcreate2(w.file.get(), kind.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                       w.path, "create group " + kind))
              .first;
    type = file_type(dtype, w.path);
    h5::Handle space = h5::check(H5Screate_simple(1, &n, nullptr), w.path, "create dataspace for " + name);
    ds = h5::check(
        H5Dcreate2(g->second.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
        w.path, "create dataset " + piece.dataset());
  }
  // The stored bytes, a slab at a time: fp32 as is, 16-bit formats converted (exactly: the values came
  // from that dtype), each slab's CRC chained onto the piece's.
  constexpr hsize_t kSlab = hsize_t(4) << 20;  // elements
  std::vector<uint16_t> half;
  for (hsize_t lo = 0; lo < n; lo += kSlab) {
    if (cancel && cancel->load(std::memory_order_relaxed))
      throw CheckpointError(where + ": the write was cancelled (the run is stopping)");
    const hsize_t count = std::min(kSlab, n - lo);
    const void* bytes = values + lo;
    if (dtype != DType::F32) {
      half.resize(count);
      for (hsize_t i = 0; i < count; ++i)
        half[i] = dtype == DType::BF16 ? fp32_to_bf16(values[lo + i]) : fp32_to_fp16(values[lo + i]);
      bytes = half.data();
    }
    piece.crc32 = crc32_update(piece.crc32, bytes, count * elem);
    h5::Lock lock;
    h5::Handle file_space = h5::check(H5Dget_space(ds.get()), w.path, "dataspace of " + piece.dataset());
    h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &lo, nullptr, &count, nullptr), w.path,
              "select a slab of " + piece.dataset());
    h5::Handle mem_space = h5::check(H5Screate_simple(1, &count, nullptr), w.path, "create slab space");
    h5::check(H5Dwrite(ds.get(), type.get(), mem_space.get(), file_space.get(), H5P_DEFAULT, bytes), w.path,
              "write dataset " + piece.dataset());
  }
  const size_t nbytes = n * elem;
  // Start this dataset's writeback at once; every 64 MB, wait for what came before it and drop those
  // pages (datasets are allocated at increasing offsets). Only a hint for speed: durability comes from
  // the fsync in finish(). Outside the HDF5 lock: the waits can take a while.
  constexpr int64_t kWindow = 64 << 20;
  haddr_t address = HADDR_UNDEF;
  {
    h5::Lock lock;
    address = H5Dget_offset(ds.get());
  }
  if (w.fd >= 0 && address != HADDR_UNDEF) {
    const auto offset = static_cast<int64_t>(address);
    sync_file_range(w.fd, offset, static_cast<int64_t>(nbytes), SYNC_FILE_RANGE_WRITE);
    if (offset - w.on_disk >= kWindow) {
      sync_file_range(w.fd, w.on_disk, offset - w.on_disk,
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      posix_fadvise(w.fd, w.on_disk, offset - w.on_disk, POSIX_FADV_DONTNEED);
      w.on_disk = offset;
    }
  }
  h5::Lock lock;
  write_int_attr(ds.get(), "global_shape", global, w.path);
  write_int_attr(ds.get(), "shard", shard.to_ints(), w.path);
  write_int_attr(ds.get(), "range", {begin, end}, w.path);
  write_int_attr(ds.get(), "crc32", {piece.crc32}, w.path);
  type.reset();
  h5::close(ds, w.path, "write dataset " + piece.dataset());
  w.entry.pieces.push_back(std::move(piece));
}

StoredFile ShardFileWriter::finish() {
  {
    h5::Lock lock;
    impl_->groups.clear();
    h5::check(H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL), impl_->path, "flush");
    h5::close(impl_->file, impl_->path, "close");  // writes what the flush left: a failure is an error
  }
  fsync_path(impl_->path);
  if (int fd = ::open(impl_->path.c_str(), O_RDONLY); fd >= 0) {  // all on disk: nothing worth caching
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  std::error_code ec;
  impl_->entry.bytes = static_cast<int64_t>(std::filesystem::file_size(impl_->path, ec));
  if (ec) throw CheckpointError("cannot read the size of " + impl_->path + ": " + ec.message());
  return impl_->entry;
}

// ---- reader ----

struct CheckpointReader::Impl {
  std::string dir;
  CheckpointMeta meta;
  // (kind, name) -> (file index, piece index) of every piece holding part of that tensor.
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<size_t, size_t>>> index;
  std::map<size_t, h5::Handle> open;
  std::set<std::string> drop_kinds;  // pieces of these kinds leave the page cache once read
  // The last piece read, as floats: the tied copy, and a value and its master in one dtype, reuse it.
  std::pair<size_t, size_t> cached_key{SIZE_MAX, SIZE_MAX};
  std::vector<float> cached;
  std::vector<uint16_t> half;

  hid_t file(size_t fi) {
    auto it = open.find(fi);
    if (it != open.end()) return it->second.get();
    const std::string path = dir + "/" + meta.files[fi].file;
    if (H5Fis_hdf5(path.c_str()) <= 0) {
      std::string reason = h5::last_error();
      throw CheckpointError("checkpoint file " + path + " is not a readable HDF5 file" +
                            (reason.empty() ? "" : " (HDF5: " + reason + ")") + ": missing, truncated or corrupted");
    }
    hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (id < 0)
      throw CheckpointError("checkpoint file " + path + " cannot be opened (HDF5: " + h5::last_error() +
                            "): truncated or corrupted");
    return open.emplace(fi, h5::Handle(id)).first->second.get();
  }

  // The piece's values, through the one-piece cache.
  const std::vector<float>& piece(size_t fi, size_t pi, int64_t& bytes_read) {
    if (cached_key == std::make_pair(fi, pi)) return cached;
    cached_key = {SIZE_MAX, SIZE_MAX};
    const StoredPiece& p = meta.files[fi].pieces[pi];
    cached.resize(p.end - p.begin);
    read_piece(fi, pi, cached.data(), bytes_read);
    cached_key = {fi, pi};
    return cached;
  }

  // Reads piece `pi` of file `fi` whole into `out` (end - begin floats), checking its CRC-32.
  void read_piece(size_t fi, size_t pi, float* out, int64_t& bytes_read) {
    const StoredFile& f = meta.files[fi];
    const StoredPiece& p = f.pieces[pi];
    const std::string path = dir + "/" + f.file;
    const std::string what = "checkpoint file " + path + ": tensor " + p.name + " (" + p.kind + ")";
    const hsize_t n = static_cast<hsize_t>(p.end - p.begin);
    hid_t fid = file(fi);
    hid_t ds_id = H5Dopen2(fid, p.dataset().c_str(), H5P_DEFAULT);
    if (ds_id < 0) throw CheckpointError(what + ": dataset " + p.dataset() + " cannot be opened (HDF5: " + h5::last_error() + ")");
    h5::Handle ds(ds_id);
    h5::Handle space = h5::check(H5Dget_space(ds.get()), path, "shape of " + p.dataset());
    h5::Handle stored_type = h5::check(H5Dget_type(ds.get()), path, "type of " + p.dataset());
    const size_t elem = p.dtype == DType::F32 ? 4 : 2;
    if (H5Sget_simple_extent_ndims(space.get()) != 1 || hsize_t(H5Sget_simple_extent_npoints(space.get())) != n ||
        H5Tget_class(stored_type.get()) != H5T_FLOAT || H5Tget_size(stored_type.get()) != elem)
      throw CheckpointError(fmt::format("{}: dataset {} is not {} {} values as the index says", what, p.dataset(), n,
                                        stored_dtype_name(p.dtype)));
    // fp32 lands straight in `out`; 16-bit values go through a reused staging buffer.
    void* dst = out;
    if (p.dtype != DType::F32) {
      half.resize(n);
      dst = half.data();
    }
    h5::Handle type = file_type(p.dtype, path);
    if (H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
      throw CheckpointError(what + ": read failed (HDF5: " + h5::last_error() + "): truncated or corrupted");
    const uint32_t crc = crc32_bytes(dst, n * elem);
    if (crc != p.crc32)
      throw CheckpointError(fmt::format("{}: checksum mismatch (CRC-32 {:08x}, index says {:08x}): the file is corrupted",
                                        what, crc, p.crc32));
    bytes_read += static_cast<int64_t>(n * elem);
    if (p.dtype != DType::F32)
      for (hsize_t i = 0; i < n; ++i) out[i] = p.dtype == DType::BF16 ? bf16_to_fp32(half[i]) : fp16_to_fp32(half[i]);
    const haddr_t offset = H5Dget_offset(ds.get());
    const int fd = posix_fd(fid);
    if (drop_kinds.count(p.kind) && fd >= 0 && offset != HADDR_UNDEF)
      posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(n * elem), POSIX_FADV_DONTNEED);
  }
};

CheckpointReader::CheckpointReader(std::string dir, const CheckpointMeta& meta) : impl_(std::make_unique<Impl>()) {
  impl_->dir = std::move(dir);
  impl_->meta = meta;
  for (size_t fi = 0; fi < meta.files.size(); ++fi)
    for (size_t pi = 0; pi < meta.files[fi].pieces.size(); ++pi) {
      const StoredPiece& p = meta.files[fi].pieces[pi];
      impl_->index[{p.kind, p.name}].push_back({fi, pi});
    }
}

CheckpointReader::~CheckpointReader() {
  h5::Lock lock;
  impl_.reset();
}

void CheckpointReader::drop_after_reading(const std::set<std::string>& kinds) { impl_->drop_kinds = kinds; }

bool CheckpointReader::has(const std::string& kind, const std::string& name) const {
  return impl_->index.count({kind, name}) > 0;
}

int64_t CheckpointReader::read(const std::string& kind, const std::string& name, const Shape& global,
                               const ShardSpec& shard, int64_t begin, int64_t end, float* out) {
  h5::Lock lock;
  auto it = impl_->index.find({kind, name});
  if (it == impl_->index.end()) return 0;
  const Shape& stored_shape = impl_->meta.tensors.at(name);
  const std::vector<ElementRun> wanted = shard_runs(global, shard, begin, end);
  int64_t filled = 0;
  for (auto [fi, pi] : it->second) {
    const StoredPiece& p = impl_->meta.files[fi].pieces[pi];
    std::vector<ElementCopy> copies = intersect_runs(shard_runs(stored_shape, p.shard, p.begin, p.end), p.begin,
                                                     wanted, begin);
    if (copies.empty()) continue;
    if (copies.size() == 1 && copies[0].src == 0 && copies[0].length == p.end - p.begin) {
      // The whole piece in one stretch (the same layout, or a replicated tensor): no staging copy.
      impl_->read_piece(fi, pi, out + copies[0].dst, bytes_read_);
      filled += copies[0].length;
      continue;
    }
    const std::vector<float>& values = impl_->piece(fi, pi, bytes_read_);
    for (const ElementCopy& c : copies) {
      std::memcpy(out + c.dst, values.data() + c.src, c.length * sizeof(float));
      filled += c.length;
    }
  }
  return filled;
}

}  // namespace gpt
