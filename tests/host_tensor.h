// A plain host tensor for tests that drive communicators directly, with no backend: heap storage of n
// elements of `dtype`, freed with the last reference.
#pragma once
#include <memory>

#include "model/tensor.h"

namespace gpt {

inline Tensor host_tensor(int64_t n, DType dtype = DType::F32) {
  auto st = std::make_shared<Storage>();
  st->bytes = n * dtype_size(dtype);
  st->ptr = new char[st->bytes ? st->bytes : 1];
  st->deleter = [](void* p, size_t) { delete[] static_cast<char*>(p); };
  return Tensor(st, 0, {n}, dtype);
}

}  // namespace gpt
