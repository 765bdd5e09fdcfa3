// What the pieces of the C ABI share, and its link-time seam to the device:
// headroom_alloc.cc (the C functions, no CUDA calls) asks
// CreateDeviceBackend for each device's backend. libheadroom_cuda_alloc.so
// links cuda_backend_factory.cc (a CudaBackend); the CPU tests of the C ABI
// link one that returns simulated devices (tests/allocator/c_abi_simulated_test.cc).
#ifndef HEADROOM_ALLOCATOR_CUDA_C_ABI_C_ABI_INTERNAL_H_
#define HEADROOM_ALLOCATOR_CUDA_C_ABI_C_ABI_INTERNAL_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/device_backend.h"

namespace headroom::c_abi {

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateDeviceBackend(int device);

// Makes `status` this thread's headroom_last_error() and returns -1.
int Fail(const absl::Status& status);

}  // namespace headroom::c_abi

#endif  // HEADROOM_ALLOCATOR_CUDA_C_ABI_C_ABI_INTERNAL_H_
