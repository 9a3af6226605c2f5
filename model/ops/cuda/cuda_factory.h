// The one entry point of the CUDA backend that code outside model/ops/cuda sees: a plain C++ declaration
// with no CUDA headers, so model/ops/backend.cpp can create the backend when it is built in
// (GPT_HAVE_CUDA) without compiling against the toolkit.
#pragma once
#include <memory>

#include "model/ops/backend.h"

namespace gpt {

// Creates the CUDA backend on device local_rank % device count. Throws std::runtime_error
// "backend cuda: no CUDA device is visible (...)" when the driver reports no usable device.
std::unique_ptr<Backend> make_cuda_backend(int local_rank);

}  // namespace gpt
