// core/cuda/device_guard.h (CUDA builds only): makes a device current for a scope and restores the
// previous one (so that e.g. creating a stream on cuda:1 does not silently move the calling thread's
// later work to cuda:1).
#pragma once

#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"

namespace ringtrain {

class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index)
      CUDA_CHECK(cudaSetDevice(index));
    else
      previous_ = -1;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

}  // namespace ringtrain
