// How a kernel reports a problem in its inputs: the first report wins (atomicCAS on the code) and the
// host turns it into an exception at its next synchronisation (CudaBackend::raise_device_errors).
#pragma once
#include <cuda_runtime.h>

#include "model/ops/cuda/cuda_backend.h"

namespace gpt::cuda {

__device__ inline void report_device_error(DeviceErrorReport* report, DeviceError code, CudaOp op, long long where,
                                           long long value, long long limit) {
  if (atomicCAS(&report->code, 0, static_cast<int>(code)) == 0) {
    report->op = static_cast<int>(op);
    report->where = where;
    report->value = value;
    report->limit = limit;
  }
}

}  // namespace gpt::cuda
