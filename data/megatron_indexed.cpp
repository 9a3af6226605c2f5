// Megatron-LM indexed datasets (see megatron_indexed.h). The .idx arrays and the .bin are read with
// pread through fixed-size windows: four sequential streams (lengths, pointers, document index, token
// data), each refilled only when a read leaves its window, so memory stays flat for any file size and
// sequences stored in order cost one system call per window. Reading with pread rather than mmap turns a
// file that shrinks under us into an error instead of a SIGBUS.
#include "data/megatron_indexed.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace gpt {

static_assert(std::endian::native == std::endian::little, "Megatron's files are little-endian, as is this reader");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

struct DTypeInfo {
  int code;
  const char* name;
  int bytes;
  bool is_float;
};

// Megatron's DType enum: the codes it writes into the header.
constexpr DTypeInfo kDTypes[] = {
    {1, "uint8", 1, false},  {2, "int8", 1, false},     {3, "int16", 2, false},   {4, "int32", 4, false},
    {5, "int64", 8, false},  {6, "float64", 8, true},   {7, "float32", 4, true},  {8, "uint16", 2, false},
};

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string quoted(const std::string& path) { return "'" + path + "'"; }

class File {
 public:
  explicit File(const std::string& path, const std::string& role) : path_(path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      const int err = errno;
      throw std::runtime_error(role + " " + quoted(path) + " " +
                               (err == ENOENT ? "not found" : "cannot be read: " + std::string(std::strerror(err))));
    }
    if (!S_ISREG(st.st_mode)) throw std::runtime_error(role + " " + quoted(path) + " is not a regular file");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw std::runtime_error(role + " " + quoted(path) + " cannot be opened: " + std::strerror(errno));
    size_ = uint64_t(st.st_size);
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Bytes [offset, offset + n) of a file through a window of `capacity` bytes (n <= capacity).
class Window {
 public:
  Window(const File& file, size_t capacity) : file_(file), buf_(capacity) {}

  const unsigned char* at(uint64_t offset, size_t n) {
    if (offset >= start_ && offset + n <= start_ + have_) return buf_.data() + (offset - start_);
    if (n > buf_.size()) buf_.resize(n);
    size_t want = size_t(std::min<uint64_t>(buf_.size(), file_.size() - std::min(offset, file_.size())));
    want = std::max(want, n);
    size_t got = 0;
    while (got < want) {
      ssize_t r = ::pread(file_.fd(), buf_.data() + got, want - got, off_t(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        const int err = errno;
        throw std::runtime_error(quoted(file_.path()) + ": read error at byte " + std::to_string(offset + got) + ": " +
                                 std::strerror(err));
      }
      if (r == 0) break;
      got += size_t(r);
    }
    if (got < n)
      throw std::runtime_error(quoted(file_.path()) + " ended at byte " + std::to_string(offset + got) + " while " +
                               std::to_string(offset + n) + " bytes were expected (truncated while being read?)");
    start_ = offset;
    have_ = got;
    return buf_.data();
  }

 private:
  const File& file_;
  std::vector<unsigned char> buf_;
  uint64_t start_ = 0;
  size_t have_ = 0;
};

// Decodes `n` ids of type T into `out`; returns the position of the first id outside [0, limit), or n.
template <typename T>
size_t decode(const unsigned char* p, size_t n, int64_t limit, int32_t* out) {
  for (size_t k = 0; k < n; ++k) {
    int64_t v = int64_t(load<T>(p + k * sizeof(T)));
    if (uint64_t(v) >= uint64_t(limit)) return k;
    out[k] = int32_t(v);
  }
  return n;
}

int64_t decode_one(int code, const unsigned char* p) {
  switch (code) {
    case 1: return load<uint8_t>(p);
    case 2: return load<int8_t>(p);
    case 3: return load<int16_t>(p);
    case 4: return load<int32_t>(p);
    case 5: return load<int64_t>(p);
    default: return load<uint16_t>(p);
  }
}

}  // namespace

class MegatronIndexedReader::Streams {
 public:
  Streams(const std::string& idx, const std::string& bin)
      : idx_file(idx, "Megatron index"), bin_file(bin, "Megatron data file"),
        lengths(idx_file, 1 << 20), pointers(idx_file, 1 << 20), doc_index(idx_file, 1 << 16),
        data(bin_file, 4 << 20) {}
  File idx_file, bin_file;
  Window lengths, pointers, doc_index, data;
  int code = 0;
  uint64_t lengths_at = 0, pointers_at = 0, doc_index_at = 0;  // byte offsets of the arrays in the .idx

  int32_t length(int64_t s) { return load<int32_t>(lengths.at(lengths_at + uint64_t(s) * 4, 4)); }
  int64_t pointer(int64_t s) { return load<int64_t>(pointers.at(pointers_at + uint64_t(s) * 8, 8)); }
  int64_t doc_start(int64_t d) { return load<int64_t>(doc_index.at(doc_index_at + uint64_t(d) * 8, 8)); }
};

MegatronIndexedReader::~MegatronIndexedReader() = default;

MegatronIndexedReader::MegatronIndexedReader(const std::string& prefix)
    : idx_path_(prefix + ".idx"), bin_path_(prefix + ".bin") {
  streams_ = std::make_unique<Streams>(idx_path_, bin_path_);
  validate();
}

void MegatronIndexedReader::validate() {
  Streams& st = *streams_;
  const std::string idx = quoted(idx_path_), bin = quoted(bin_path_);
  const uint64_t idx_size = st.idx_file.size();
  unsigned char header[kHeaderBytes] = {};
  size_t header_have = size_t(std::min<uint64_t>(idx_size, kHeaderBytes));
  if (header_have) std::memcpy(header, st.lengths.at(0, header_have), header_have);
  if (std::memcmp(header, kMagic, std::min<size_t>(header_have, sizeof kMagic)) != 0)
    throw std::runtime_error(idx + " is not a Megatron indexed-dataset index: it does not start with the magic "
                             "bytes MMIDIDX\\0\\0");
  if (header_have < kHeaderBytes)
    throw std::runtime_error(idx + ": header truncated: the file has " + std::to_string(idx_size) +
                             " bytes, the header alone needs " + std::to_string(kHeaderBytes));
  const uint64_t version = load<uint64_t>(header + 9);
  if (version != 1)
    throw std::runtime_error(idx + ": unsupported version " + std::to_string(version) + " (only version 1 is known)");
  const int code = header[17];
  const DTypeInfo* dtype = nullptr;
  for (const auto& d : kDTypes)
    if (d.code == code) dtype = &d;
  if (!dtype)
    throw std::runtime_error(idx + ": unknown token dtype code " + std::to_string(code) +
                             " (Megatron's codes are 1 to 8)");
  if (dtype->is_float)
    throw std::runtime_error(idx + ": token dtype is " + dtype->name +
                             "; token ids must be integers (uint8, int8, int16, int32, int64 or uint16)");
  st.code = code;
  dtype_name_ = dtype->name;
  item_bytes_ = dtype->bytes;

  const uint64_t seqs = load<uint64_t>(header + 18), doc_entries = load<uint64_t>(header + 26);
  // Compared by division first: a corrupted count must not wrap around into a plausible size.
  const bool fits = seqs <= idx_size / 12 && doc_entries <= idx_size / 8;
  const uint64_t need = fits ? kHeaderBytes + seqs * 12 + doc_entries * 8 : 0;
  if (!fits || need > idx_size)
    throw std::runtime_error(idx + ": index arrays truncated: the header declares " + std::to_string(seqs) +
                             " sequences and " + std::to_string(doc_entries) + " document-index entries, which need " +
                             (fits ? std::to_string(need) : "more than " + std::to_string(idx_size)) +
                             " bytes; the file has " + std::to_string(idx_size));
  if (need < idx_size) {
    const uint64_t extra = idx_size - need;
    throw std::runtime_error(idx + ": " + std::to_string(extra) + " bytes follow the document index" +
                             (extra == seqs ? " (sequence modes: a multimodal dataset; only text datasets convert)"
                                            : " (corrupted, or a format other than Megatron's)"));
  }
  num_sequences_ = int64_t(seqs);
  st.lengths_at = kHeaderBytes;
  st.pointers_at = kHeaderBytes + seqs * 4;
  st.doc_index_at = kHeaderBytes + seqs * 12;
  if (doc_entries == 0)
    throw std::runtime_error(idx + ": the document index is empty; it must start at 0 and end at the sequence count " +
                             std::to_string(seqs));
  num_documents_ = int64_t(doc_entries) - 1;
  const int64_t first = st.doc_start(0), last = st.doc_start(num_documents_);
  if (first != 0)
    throw std::runtime_error(idx + ": the document index starts at " + std::to_string(first) + ", not at 0");
  if (last != num_sequences_)
    throw std::runtime_error(idx + ": the document index ends at " + std::to_string(last) +
                             ", not at the sequence count " + std::to_string(seqs));

  // One pass over every document and sequence: the index rises, and each sequence lies inside the .bin.
  const uint64_t bin_size = st.bin_file.size();
  int64_t begin = 0;
  for (int64_t d = 0; d < num_documents_; ++d) {
    const int64_t end = st.doc_start(d + 1);
    if (end < begin)
      throw std::runtime_error(idx + ": the document index decreases: entry " + std::to_string(d) + " is " +
                               std::to_string(begin) + ", entry " + std::to_string(d + 1) + " is " +
                               std::to_string(end));
    if (end > num_sequences_)
      throw std::runtime_error(idx + ": document index entry " + std::to_string(d + 1) + " is " +
                               std::to_string(end) + ", past the sequence count " + std::to_string(seqs));
    for (int64_t s = begin; s < end; ++s) {
      const int64_t len = st.length(s), ptr = st.pointer(s);
      auto where = [&] { return "sequence " + std::to_string(s) + " (document " + std::to_string(d) + ")"; };
      if (len < 0) throw std::runtime_error(idx + ": " + where() + " has negative length " + std::to_string(len));
      if (ptr < 0) throw std::runtime_error(idx + ": " + where() + " has negative pointer " + std::to_string(ptr));
      const uint64_t bytes = uint64_t(len) * uint64_t(item_bytes_);
      if (uint64_t(ptr) > bin_size || bytes > bin_size - uint64_t(ptr))
        throw std::runtime_error(idx + " places " + where() + " at byte " + std::to_string(ptr) + " with " +
                                 std::to_string(len) + " " + dtype_name_ + " ids, ending at byte " +
                                 std::to_string(uint64_t(ptr) + bytes) + ", past the end of " + bin + " (" +
                                 std::to_string(bin_size) + " bytes): a truncated .bin, or a corrupted pointer");
      token_bytes_ += int64_t(bytes);
    }
    begin = end;
  }
}

bool MegatronIndexedReader::next_document(std::vector<int32_t>& ids, int64_t vocab_size) {
  ids.clear();
  if (next_doc_ >= num_documents_) return false;
  Streams& st = *streams_;
  const int64_t d = next_doc_++;
  const int64_t begin = st.doc_start(d), end = st.doc_start(d + 1);
  const size_t window_items = (size_t(4) << 20) / size_t(item_bytes_);
  for (int64_t s = begin; s < end; ++s) {
    const int64_t len = st.length(s);
    const uint64_t ptr = uint64_t(st.pointer(s));
    for (int64_t done = 0; done < len;) {
      const size_t n = size_t(std::min<int64_t>(len - done, int64_t(window_items)));
      const unsigned char* p = st.data.at(ptr + uint64_t(done) * uint64_t(item_bytes_), n * size_t(item_bytes_));
      const size_t at = ids.size();
      ids.resize(at + n);
      size_t ok = 0;
      switch (st.code) {
        case 1: ok = decode<uint8_t>(p, n, vocab_size, ids.data() + at); break;
        case 2: ok = decode<int8_t>(p, n, vocab_size, ids.data() + at); break;
        case 3: ok = decode<int16_t>(p, n, vocab_size, ids.data() + at); break;
        case 4: ok = decode<int32_t>(p, n, vocab_size, ids.data() + at); break;
        case 5: ok = decode<int64_t>(p, n, vocab_size, ids.data() + at); break;
        default: ok = decode<uint16_t>(p, n, vocab_size, ids.data() + at); break;
      }
      if (ok < n) {
        const int64_t id = decode_one(st.code, p + ok * size_t(item_bytes_));
        throw std::runtime_error(quoted(bin_path_) + ": document " + std::to_string(d) + ", sequence " +
                                 std::to_string(s) + ", token " + std::to_string(done + int64_t(ok)) + ": id " +
                                 std::to_string(id) + (id < 0 ? " is negative" : " is not below the vocabulary size " +
                                 std::to_string(vocab_size)) + " (made with another tokenizer?)");
      }
      done += int64_t(n);
      bytes_read_ += int64_t(n) * item_bytes_;
    }
  }
  return true;
}

}  // namespace gpt
