// HDF5 handle ownership, locking and error conversion (see hdf5_util.h).
#include "data/hdf5_util.h"

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

}  // namespace

Lock::Lock() : guard_(library_mutex()) { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

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
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    default: break;
  }
  id_ = H5I_INVALID_HID;
}

std::string last_error() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &msg);
  return msg;
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
