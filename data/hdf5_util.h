// Thin RAII over the HDF5 C API for token shards and checkpoints: owned handles, one process-wide lock
// (the library is not reentrant), automatic error-stack printing switched off, files created for writing
// with a close that reports failure, and every failure turned into a std::runtime_error that names the
// file, the step, and HDF5's own innermost reason.
// Exit: HDF5 1.10 frees a file's state when the flush inside H5Fclose fails (a full disk) yet leaves its
// ID registered, and its own clean-up at exit then dereferences the freed state and crashes. So the
// library's exit hook is never installed (H5dont_atexit on first use) and a file whose close failed is
// never touched again; every file this code opens is closed explicitly, so nothing is left for it.
#pragma once
#include <hdf5.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace gpt::h5 {

// Serialises every HDF5 call of the process and silences HDF5's stderr error printing on this thread
// (the error stack is per thread in thread-safe builds, so this is done on every entry). The first Lock
// of the process comes before any other HDF5 call and switches off the library's exit hook.
class Lock {
 public:
  Lock();

 private:
  std::lock_guard<std::recursive_mutex> guard_;
};

// An owned hid_t closed with the function that matches its kind, under the process's HDF5 lock (a
// failure to close is ignored here: reset runs while unwinding; use h5::close where the close must
// succeed).
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  ~Handle() { reset(); }
  void reset();
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Gives up ownership without closing.
  hid_t release() {
    hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// The innermost description on HDF5's error stack of this thread ("" when empty), on one line; a failed
// POSIX read or write is shortened to its operation and the system's reason ("file write failed: No space
// left on device") without the buffer addresses and offsets HDF5 adds.
std::string last_error();

// Creates (truncating) `path` for writing in the HDF5 1.10 format, whose metadata is checksummed. The
// close degree is strong: closing the file closes any object still open in it, so closing the file is
// the real close and its result is the file's.
Handle create_file(const std::string& path);
// Closes what `h` holds and throws "<file>: <what> (HDF5: <reason>)" when that fails. Closing writes
// what HDF5 still caches: a chunked dataset's last chunks, a file's metadata, so on a full disk this is
// where a write fails. The handle is empty afterwards either way, and a failed id is never used again.
void close(Handle& h, const std::string& file, const std::string& what);

// Throws std::runtime_error("<file>: <what> (HDF5: <reason>)") when id < 0, else wraps it.
Handle check(hid_t id, const std::string& file, const std::string& what);
void check(herr_t status, const std::string& file, const std::string& what);

}  // namespace gpt::h5
