#include "allocator/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace headroom::cuda {

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

absl::StatusOr<DeviceInfo> QueryDevice(int ordinal) {
  cudaDeviceProp props{};
  if (cudaError_t err = cudaGetDeviceProperties(&props, ordinal); err != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", ordinal, ": ", cudaGetErrorString(err)));
  }
  return DeviceInfo{.ordinal = ordinal,
                    .name = props.name,
                    .total_memory_bytes = props.totalGlobalMem,
                    .compute_capability_major = props.major,
                    .compute_capability_minor = props.minor,
                    .sm_count = props.multiProcessorCount};
}

}  // namespace headroom::cuda
