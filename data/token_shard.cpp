// Writing and reading HDF5 token shards. Files use the HDF5 1.10 format (checksummed metadata) and the
// Fletcher-32 filter on every chunk, so a corrupted shard fails loudly at open or read instead of
// yielding wrong tokens; everything the reader takes from the file is range-checked before use.
#include "data/token_shard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "data/hdf5_util.h"

namespace gpt {

namespace {

constexpr hsize_t kTokenChunk = 32768;  // ids per chunk: the unit a reader fetches and checksums
constexpr hsize_t kOffsetChunk = 65536;

void write_scalar_attr(hid_t obj, const char* name, int64_t v, const std::string& file) {
  h5::Handle space = h5::check(H5Screate(H5S_SCALAR), file, "create attribute space");
  h5::Handle attr = h5::check(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), file,
                              std::string("create attribute ") + name);
  h5::check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &v), file, std::string("write attribute ") + name);
}

void write_string_attr(hid_t obj, const char* name, const std::string& v, const std::string& file) {
  h5::Handle space = h5::check(H5Screate(H5S_SCALAR), file, "create attribute space");
  // Fixed-length, so the string lives in the checksummed object header; variable-length strings sit
  // in the global heap, which has no checksum and which HDF5 follows blindly when it is corrupted.
  h5::Handle type = h5::check(H5Tcopy(H5T_C_S1), file, "create string type");
  H5Tset_size(type.get(), v.size() + 1);
  H5Tset_strpad(type.get(), H5T_STR_NULLTERM);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  h5::Handle attr = h5::check(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), file,
                              std::string("create attribute ") + name);
  h5::check(H5Awrite(attr.get(), type.get(), v.c_str()), file, std::string("write attribute ") + name);
}

void write_dataset(hid_t f, const char* name, hid_t file_type, hid_t mem_type, const void* data, hsize_t n,
                   hsize_t chunk, const std::string& file) {
  h5::Handle space = h5::check(H5Screate_simple(1, &n, &n), file, std::string("create dataspace for ") + name);
  h5::Handle dcpl = h5::check(H5Pcreate(H5P_DATASET_CREATE), file, "create dataset properties");
  hsize_t c = std::min(chunk, n);
  h5::check(H5Pset_chunk(dcpl.get(), 1, &c), file, "set chunking");
  h5::check(H5Pset_fletcher32(dcpl.get()), file, "enable Fletcher-32 checksums");
  h5::Handle ds = h5::check(H5Dcreate2(f, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), file,
                            std::string("create dataset ") + name);
  h5::check(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), file,
            std::string("write dataset ") + name);
  // The last chunks stay in the chunk cache until the dataset closes: their write can fail only here.
  h5::close(ds, file, std::string("write dataset ") + name);
}

// Reads an optional integer attribute; false when absent. Throws when present but not an integer.
bool read_int_attr(hid_t obj, const char* name, int64_t& v, const std::string& file) {
  htri_t exists = H5Aexists(obj, name);
  if (exists < 0) h5::check(herr_t(-1), file, std::string("look up attribute ") + name);
  if (exists == 0) return false;
  h5::Handle attr = h5::check(H5Aopen(obj, name, H5P_DEFAULT), file, std::string("open attribute ") + name);
  h5::Handle type = h5::check(H5Aget_type(attr.get()), file, std::string("type of attribute ") + name);
  h5::Handle space = h5::check(H5Aget_space(attr.get()), file, std::string("shape of attribute ") + name);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1)
    throw std::runtime_error(file + ": attribute " + name + " is not a single integer");
  h5::check(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), file, std::string("read attribute ") + name);
  return true;
}

bool read_string_attr(hid_t obj, const char* name, std::string& v, const std::string& file) {
  htri_t exists = H5Aexists(obj, name);
  if (exists < 0) h5::check(herr_t(-1), file, std::string("look up attribute ") + name);
  if (exists == 0) return false;
  h5::Handle attr = h5::check(H5Aopen(obj, name, H5P_DEFAULT), file, std::string("open attribute ") + name);
  h5::Handle type = h5::check(H5Aget_type(attr.get()), file, std::string("type of attribute ") + name);
  h5::Handle space = h5::check(H5Aget_space(attr.get()), file, std::string("shape of attribute ") + name);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Sget_simple_extent_npoints(space.get()) != 1)
    throw std::runtime_error(file + ": attribute " + name + " is not a single string");
  if (H5Tis_variable_str(type.get()) > 0) {  // as h5py writes str attributes
    h5::Handle mem = h5::check(H5Tcopy(H5T_C_S1), file, "create string type");
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* p = nullptr;
    h5::check(H5Aread(attr.get(), mem.get(), &p), file, std::string("read attribute ") + name);
    v = p ? p : "";
    if (p) H5free_memory(p);
  } else {
    size_t n = H5Tget_size(type.get());
    if (n == 0 || n > (1u << 20)) throw std::runtime_error(file + ": attribute " + name + " has an invalid size");
    std::string buf(n, '\0');
    h5::Handle mem = h5::check(H5Tcopy(type.get()), file, "copy string type");
    h5::check(H5Aread(attr.get(), mem.get(), buf.data()), file, std::string("read attribute ") + name);
    v = buf.substr(0, buf.find('\0'));
  }
  return true;
}

std::string describe_type(hid_t type) {
  H5T_class_t cls = H5Tget_class(type);
  size_t bits = H5Tget_size(type) * 8;
  if (cls == H5T_INTEGER)
    return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
  if (cls == H5T_FLOAT) return "float" + std::to_string(bits);
  return "a non-numeric type";
}

}  // namespace

void write_token_shard(const std::string& path, std::span<const uint32_t> tokens, std::span<const uint64_t> offsets,
                       const ShardMeta& meta) {
  if (tokens.empty()) throw std::runtime_error(path + ": refusing to write a shard without tokens");
  if (offsets.size() < 2 || offsets.front() != 0 || offsets.back() != tokens.size() ||
      !std::is_sorted(offsets.begin(), offsets.end()))
    throw std::runtime_error(path + ": document offsets must rise from 0 to the token count");
  if (meta.vocab_size <= 0 || meta.vocab_size > (int64_t(1) << 32) || meta.eod_id < 0 || meta.eod_id >= meta.vocab_size)
    throw std::runtime_error(path + ": invalid vocab_size / eod_id");
  uint32_t max_id = *std::max_element(tokens.begin(), tokens.end());
  if (int64_t(max_id) >= meta.vocab_size)
    throw std::runtime_error(path + ": token id " + std::to_string(max_id) + " >= vocab_size " +
                             std::to_string(meta.vocab_size));
  const bool narrow = meta.vocab_size <= 65535;
  const std::string tmp = path + ".tmp";
  {
    h5::Lock lock;
    // The 1.10 format checksums every metadata block, which lets a reader detect corruption.
    h5::Handle f = h5::create_file(tmp);
    if (narrow) {
      std::vector<uint16_t> narrow_tokens(tokens.begin(), tokens.end());
      write_dataset(f.get(), "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, narrow_tokens.data(), tokens.size(),
                    kTokenChunk, tmp);
    } else {
      write_dataset(f.get(), "tokens", H5T_STD_U32LE, H5T_NATIVE_UINT32, tokens.data(), tokens.size(), kTokenChunk,
                    tmp);
    }
    write_dataset(f.get(), "doc_offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, offsets.data(), offsets.size(),
                  kOffsetChunk, tmp);
    hid_t root = f.get();
    write_scalar_attr(root, "format_version", kShardFormatVersion, tmp);
    write_scalar_attr(root, "vocab_size", meta.vocab_size, tmp);
    write_scalar_attr(root, "eod_id", meta.eod_id, tmp);
    write_scalar_attr(root, "max_token_id", max_id, tmp);
    write_scalar_attr(root, "num_tokens", int64_t(tokens.size()), tmp);
    write_scalar_attr(root, "num_docs", int64_t(offsets.size() - 1), tmp);
    write_string_attr(root, "tokenizer", meta.tokenizer, tmp);
    write_string_attr(root, "tokenizer_hash", meta.tokenizer_hash, tmp);
    h5::check(H5Fflush(f.get(), H5F_SCOPE_GLOBAL), tmp, "flush");
    h5::close(f, tmp, "close");  // checked: a shard whose close failed must not be renamed into place
  }
  // Durable before it becomes visible under its final name.
  int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(tmp + ": cannot sync to disk");
  }
  ::close(fd);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

struct TokenShardReader::Handles {
  h5::Handle file, tokens;
};

TokenShardReader::~TokenShardReader() {
  if (h_) {
    h5::Lock lock;
    h_.reset();
  }
}

TokenShardReader::TokenShardReader(const std::string& path) : path_(path), h_(std::make_unique<Handles>()) {
  try {
    open();
  } catch (...) {
    h5::Lock lock;  // close what was opened while HDF5 is locked and silenced
    h_.reset();
    throw;
  }
}

void TokenShardReader::open() {
  const std::string& path = path_;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw std::runtime_error("data shard '" + path + "' not found");
  if (!std::filesystem::is_regular_file(path, ec))
    throw std::runtime_error("data shard '" + path + "' is not a regular file");
  const std::string what = "data shard '" + path + "'";
  h5::Lock lock;
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw std::runtime_error(what + " is not an HDF5 file (wrong file, or truncated before its superblock)");
  h_->file = h5::check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), what,
                       "cannot be opened (truncated or corrupted?)");
  hid_t root = h_->file.get();
  uintmax_t file_bytes = 0;

  if (!read_int_attr(root, "format_version", meta_.format_version, what))
    throw std::runtime_error(what + " has no format_version attribute: not a gpt-train token shard");
  if (meta_.format_version != kShardFormatVersion)
    throw std::runtime_error(what + " has format_version " + std::to_string(meta_.format_version) +
                             "; this build reads version " + std::to_string(kShardFormatVersion));
  if (!read_int_attr(root, "vocab_size", meta_.vocab_size, what) || meta_.vocab_size <= 0 ||
      meta_.vocab_size > (int64_t(1) << 31))
    throw std::runtime_error(what + ": missing or invalid vocab_size attribute");
  if (!read_int_attr(root, "eod_id", meta_.eod_id, what) || meta_.eod_id < 0 || meta_.eod_id >= meta_.vocab_size)
    throw std::runtime_error(what + ": missing eod_id attribute, or it is outside the vocabulary");
  if (!read_string_attr(root, "tokenizer", meta_.tokenizer, what) || meta_.tokenizer.empty())
    throw std::runtime_error(what + ": missing tokenizer attribute");
  if (!read_string_attr(root, "tokenizer_hash", meta_.tokenizer_hash, what))
    throw std::runtime_error(what + ": missing tokenizer_hash attribute");

  // tokens: 1-D unsigned 16- or 32-bit integers wide enough for the vocabulary.
  if (H5Lexists(root, "tokens", H5P_DEFAULT) <= 0) throw std::runtime_error(what + " has no 'tokens' dataset");
  h5::Handle dapl = h5::check(H5Pcreate(H5P_DATASET_ACCESS), what, "create dataset access properties");
  H5Pset_chunk_cache(dapl.get(), 521, 4u << 20, 0.75);
  h_->tokens = h5::check(H5Dopen2(root, "tokens", dapl.get()), what, "cannot open dataset 'tokens'");
  {
    h5::Handle type = h5::check(H5Dget_type(h_->tokens.get()), what, "type of 'tokens'");
    h5::Handle space = h5::check(H5Dget_space(h_->tokens.get()), what, "shape of 'tokens'");
    size_t bytes = H5Tget_size(type.get());
    bool ok = H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_NONE &&
              (bytes == 4 || (bytes == 2 && meta_.vocab_size <= 65536));
    if (!ok)
      throw std::runtime_error(what + ": dataset 'tokens' has dtype " + describe_type(type.get()) + "; expected " +
                               (meta_.vocab_size <= 65535 ? "uint16 (or uint32)" : "uint32") + " for vocab_size " +
                               std::to_string(meta_.vocab_size));
    meta_.token_bits = int(bytes * 8);
    file_bytes = std::filesystem::file_size(path, ec);
    if (H5Sget_simple_extent_ndims(space.get()) != 1)
      throw std::runtime_error(what + ": dataset 'tokens' is not one-dimensional");
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space.get(), &n, nullptr);
    meta_.num_tokens = int64_t(n);
    // Uncompressed storage: a dataset larger than the file means corrupted metadata.
    if (!ec && n > file_bytes / bytes)
      throw std::runtime_error(what + ": dataset 'tokens' claims " + std::to_string(n) +
                               " ids, more than the file can hold (truncated or corrupted)");
  }

  // doc_offsets: 1-D uint64, from 0 to num_tokens, never decreasing.
  if (H5Lexists(root, "doc_offsets", H5P_DEFAULT) <= 0)
    throw std::runtime_error(what + " has no 'doc_offsets' dataset");
  h5::Handle offs = h5::check(H5Dopen2(root, "doc_offsets", H5P_DEFAULT), what, "cannot open dataset 'doc_offsets'");
  {
    h5::Handle type = h5::check(H5Dget_type(offs.get()), what, "type of 'doc_offsets'");
    h5::Handle space = h5::check(H5Dget_space(offs.get()), what, "shape of 'doc_offsets'");
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 8)
      throw std::runtime_error(what + ": dataset 'doc_offsets' has dtype " + describe_type(type.get()) +
                               "; expected uint64");
    if (H5Sget_simple_extent_ndims(space.get()) != 1)
      throw std::runtime_error(what + ": dataset 'doc_offsets' is not one-dimensional");
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space.get(), &n, nullptr);
    if (n < 2) throw std::runtime_error(what + " holds no documents (doc_offsets has " + std::to_string(n) + " entries)");
    if (n > hsize_t(meta_.num_tokens) + 1 || (!ec && n > file_bytes / 8))
      throw std::runtime_error(what + ": doc_offsets has more entries than there are tokens");
    offsets_.resize(n);
    h5::check(H5Dread(offs.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets_.data()), what,
              "cannot read 'doc_offsets' (corrupted?)");
    meta_.num_docs = int64_t(n - 1);
  }
  if (offsets_.front() != 0 || offsets_.back() != uint64_t(meta_.num_tokens) ||
      !std::is_sorted(offsets_.begin(), offsets_.end()))
    throw std::runtime_error(what + ": doc_offsets do not rise from 0 to the token count " +
                             std::to_string(meta_.num_tokens));

  int64_t v = 0;
  if (read_int_attr(root, "num_tokens", v, what) && v != meta_.num_tokens)
    throw std::runtime_error(what + ": num_tokens attribute " + std::to_string(v) + " disagrees with the dataset (" +
                             std::to_string(meta_.num_tokens) + ")");
  if (read_int_attr(root, "num_docs", v, what) && v != meta_.num_docs)
    throw std::runtime_error(what + ": num_docs attribute " + std::to_string(v) + " disagrees with doc_offsets (" +
                             std::to_string(meta_.num_docs) + ")");
  if (read_int_attr(root, "max_token_id", meta_.max_token_id, what) && meta_.max_token_id >= meta_.vocab_size)
    throw std::runtime_error(what + ": max_token_id " + std::to_string(meta_.max_token_id) + " >= vocab_size " +
                             std::to_string(meta_.vocab_size));
}

void TokenShardReader::read(int64_t begin, int64_t count, int32_t* out) const {
  if (begin < 0 || count < 0 || begin + count > meta_.num_tokens)
    throw std::runtime_error("data shard '" + path_ + "': read of tokens [" + std::to_string(begin) + ", " +
                             std::to_string(begin + count) + ") is outside its " + std::to_string(meta_.num_tokens) +
                             " tokens");
  if (count == 0) return;
  const std::string what = "data shard '" + path_ + "'";
  {
    h5::Lock lock;
    h5::Handle fspace = h5::check(H5Dget_space(h_->tokens.get()), what, "shape of 'tokens'");
    hsize_t start = hsize_t(begin), n = hsize_t(count);
    h5::check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr), what,
              "select tokens");
    h5::Handle mspace = h5::check(H5Screate_simple(1, &n, nullptr), what, "create memory space");
    // Read as uint32 so no id is clipped by the conversion; checked against the vocabulary below.
    h5::check(H5Dread(h_->tokens.get(), H5T_NATIVE_UINT32, mspace.get(), fspace.get(), H5P_DEFAULT, out), what,
              "cannot read tokens [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                  ") (truncated or corrupted?)");
  }
  const auto* ids = reinterpret_cast<const uint32_t*>(out);
  for (int64_t k = 0; k < count; ++k)
    if (ids[k] >= uint64_t(meta_.vocab_size))
      throw std::runtime_error(what + ": token " + std::to_string(begin + k) + " has id " + std::to_string(ids[k]) +
                               ", outside its vocabulary of " + std::to_string(meta_.vocab_size));
}

}  // namespace gpt
