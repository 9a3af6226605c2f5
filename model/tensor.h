// Tensor: a typed, shaped view into reference-counted device or host memory. Tensors never own compute:
// every kernel lives behind the Backend interface (model/ops/backend.h), so the same model code drives
// the CPU and CUDA backends. A view shares storage with its parent (flat gradient buffers hand out
// per-parameter views), and the storage records which device it lives on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

// F64 holds fp64 sums that stay on the device until one download (a step's loss and squared gradient
// norms); no compute op takes it.
enum class DType : uint8_t { F32, BF16, F16, I32, F64 };
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

// One allocation. The deleter is supplied by the backend that made it.
struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  void (*deleter)(void* ptr, size_t bytes) = nullptr;
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (deleter && ptr) deleter(ptr, bytes);
  }
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, Shape shape, DType dtype)
      : storage_(std::move(storage)), offset_(byte_offset), shape_(std::move(shape)), dtype_(dtype) {}

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t bytes() const { return numel() * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::CPU; }

  void* raw() const { return static_cast<char*>(storage_->ptr) + offset_; }
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }
  float* f32() const { return data<float>(); }
  int32_t* i32() const { return data<int32_t>(); }

  // Same storage, new shape with the same element count.
  Tensor view(Shape shape) const;
  // Contiguous sub-range of elements [start, start + numel(shape)) viewed with `shape`.
  Tensor slice_elems(int64_t start, Shape shape) const;
  // Rows [row_begin, row_end) of the leading dimension.
  Tensor rows(int64_t row_begin, int64_t row_end) const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace gpt
