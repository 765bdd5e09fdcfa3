// libheadroom_cuda_alloc.so serves real GPUs (see c_abi_internal.h).
#include "allocator/cuda/c_abi/c_abi_internal.h"
#include "allocator/cuda/cuda_backend.h"

namespace headroom::c_abi {

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateDeviceBackend(int device) {
  absl::StatusOr<std::unique_ptr<cuda::CudaBackend>> backend = cuda::CudaBackend::Create(device);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<DeviceBackend>(*std::move(backend));
}

}  // namespace headroom::c_abi
