// The CUDA backend the CUDA tests share, created once per process.
#include "tests/cuda_test_util.h"

namespace gpt {

Backend* cuda_backend(std::string* why) {
  static std::unique_ptr<Backend> backend;
  static std::string error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    try {
      backend = make_backend("cuda");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (why) *why = error;
  return backend.get();
}

}  // namespace gpt
