// What the CUDA runtime reports about the devices of this machine.
//
// The only question asked before any CUDA backend is built: is there a usable
// device? On a machine without a driver (CI, laptops) the answer is zero
// devices, never an abort, so GPU tests can skip cleanly.
#ifndef HEADROOM_ALLOCATOR_CUDA_CUDA_DEVICE_H_
#define HEADROOM_ALLOCATOR_CUDA_CUDA_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace headroom::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int sm_count = 0;
};

// Number of CUDA devices; 0 when there is no driver or no device.
int CudaDeviceCount();

absl::StatusOr<DeviceInfo> QueryDevice(int ordinal);

}  // namespace headroom::cuda

#endif  // HEADROOM_ALLOCATOR_CUDA_CUDA_DEVICE_H_
