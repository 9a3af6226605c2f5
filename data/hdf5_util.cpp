// HDF5 handle ownership, locking and error conversion (see hdf5_util.h).
#include "data/hdf5_util.h"

#include <algorithm>

namespace gpt::h5 {

namespace {

std::recursive_mutex& library_mutex() {
  static std::recursive_mutex m;
  return m;
}

herr_t innermost(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err->desc) *out = err->desc;  // walking upward: entry 0 is where the error arose
  return 0;
}

herr_t close_id(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE: return H5Fclose(id);
    case H5I_DATASET: return H5Dclose(id);
    case H5I_DATASPACE: return H5Sclose(id);
    case H5I_DATATYPE: return H5Tclose(id);
    case H5I_ATTR: return H5Aclose(id);
    case H5I_GENPROP_LST: return H5Pclose(id);
    case H5I_GROUP: return H5Gclose(id);
    default: return -1;
  }
}

}  // namespace

Lock::Lock() : guard_(library_mutex()) {
  // Must precede the library's initialisation, which any other call triggers (see hdf5_util.h).
  static const bool no_exit_hook = H5dont_atexit() >= 0;
  (void)no_exit_hook;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::reset() {
  if (id_ < 0) return;
  Lock lock;  // a handle may go while unwinding, outside its owner's lock, with another thread in HDF5
  close_id(id_);
  id_ = H5I_INVALID_HID;
}

std::string last_error() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &msg);
  // "file write failed: time = ..., filename = '...', file descriptor = 3, errno = 28, error message =
  // 'No space left on device', buf = 0x..., ..." -> "file write failed: No space left on device".
  const std::string key = "error message = '";
  if (size_t at = msg.find(key), colon = msg.find(':'); at != std::string::npos && colon < at) {
    const size_t from = at + key.size();
    msg = msg.substr(0, colon) + ": " + msg.substr(from, msg.find('\'', from) - from);
  }
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  return msg;
}

Handle create_file(const std::string& path) {
  Handle fapl = check(H5Pcreate(H5P_FILE_ACCESS), path, "create file access properties");
  check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110), path, "select file format");
  check(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), path, "set file close degree");
  return check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), path, "create file");
}

void close(Handle& h, const std::string& file, const std::string& what) {
  // A file whose close failed must never be passed to HDF5 again (see hdf5_util.h): drop the handle first.
  check(close_id(h.release()), file, what);
}

Handle check(hid_t id, const std::string& file, const std::string& what) {
  if (id < 0) {
    std::string reason = last_error();
    throw std::runtime_error(file + ": " + what + (reason.empty() ? "" : " (HDF5: " + reason + ")"));
  }
  return Handle(id);
}

void check(herr_t status, const std::string& file, const std::string& what) {
  if (status < 0) {
    std::string reason = last_error();
    throw std::runtime_error(file + ": " + what + (reason.empty() ? "" : " (HDF5: " + reason + ")"));
  }
}

}  // namespace gpt::h5
