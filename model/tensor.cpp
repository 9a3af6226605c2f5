// Shape helpers and view arithmetic for Tensor; no element access happens here.
#include "model/tensor.h"

#include <sstream>
#include <stdexcept>

namespace gpt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::I32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::I32: return "int32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
  }
  return "?";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

Tensor Tensor::view(Shape shape) const {
  if (shape_numel(shape) != numel())
    throw std::invalid_argument("Tensor::view: " + shape_str(shape_) + " cannot be viewed as " + shape_str(shape));
  return Tensor(storage_, offset_, std::move(shape), dtype_);
}

Tensor Tensor::slice_elems(int64_t start, Shape shape) const {
  if (start < 0 || start + shape_numel(shape) > numel())
    throw std::out_of_range("Tensor::slice_elems: range past end of " + shape_str(shape_));
  return Tensor(storage_, offset_ + start * dtype_size(dtype_), std::move(shape), dtype_);
}

Tensor Tensor::rows(int64_t row_begin, int64_t row_end) const {
  Shape s = shape_;
  int64_t row = numel() / s.at(0);
  s[0] = row_end - row_begin;
  return slice_elems(row_begin * row, s);
}

}  // namespace gpt
