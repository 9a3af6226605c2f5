// Thin RAII over the HDF5 C API for the token shards: owned handles, one process-wide lock (the library
// is not reentrant), automatic error-stack printing switched off, and every failure turned into a
// std::runtime_error that names the file, the step, and HDF5's own innermost reason.
#pragma once
#include <hdf5.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace gpt::h5 {

// Serialises every HDF5 call of the process and silences HDF5's stderr error printing on this thread
// (the error stack is per thread in thread-safe builds, so this is done on every entry).
class Lock {
 public:
  Lock();

 private:
  std::lock_guard<std::recursive_mutex> guard_;
};

// An owned hid_t closed with the function that matches its kind.
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

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// The innermost description on HDF5's error stack of this thread ("" when empty).
std::string last_error();

// Throws std::runtime_error("<file>: <what> (HDF5: <reason>)") when id < 0, else wraps it.
Handle check(hid_t id, const std::string& file, const std::string& what);
void check(herr_t status, const std::string& file, const std::string& what);

}  // namespace gpt::h5
