// The executor on a GPU: the caching allocator over CudaBackend, CudaKernels
// (cuBLAS and a few CUDA kernels) on the default stream, and host copies in
// pinned memory (cudaHostAlloc) so that offload copies run at the link's
// speed, asynchronously on the executor's copy stream. CudaBackend creates
// streams non-blocking, so the copies overlap kernels on the default stream
// (Note [Executor copies] in executor/executor.cc orders them with events).
//
//   HEADROOM_ASSIGN_OR_RETURN(auto gpu, CudaComputeDevice::Create(0));
//   HEADROOM_ASSIGN_OR_RETURN(auto executor, PlanExecutor::Create(model, in, schedule, {}, std::move(gpu)));
#ifndef HEADROOM_EXECUTOR_CUDA_CUDA_COMPUTE_DEVICE_H_
#define HEADROOM_EXECUTOR_CUDA_CUDA_COMPUTE_DEVICE_H_

#include <cublas_v2.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/cuda/cuda_backend.h"
#include "executor/compute_device.h"
#include "executor/cuda/cuda_kernels.h"

namespace headroom {

// Pinned host memory: one cudaHostAlloc per region (the host pool asks once).
std::unique_ptr<HostRegionSource> PinnedHostMemory();

class CudaComputeDevice final : public ComputeDevice {
 public:
  // Errors: no such device, or the CUDA runtime or cuBLAS refusing to start.
  static absl::StatusOr<std::unique_ptr<CudaComputeDevice>> Create(int device);
  ~CudaComputeDevice() override;

  std::string name() const override;
  DeviceBackend& backend() override { return *backend_; }
  const ExecutorKernels& kernels() const override { return *kernels_; }
  std::unique_ptr<HostRegionSource> HostMemory() const override { return PinnedHostMemory(); }
  absl::StatusOr<std::byte*> KernelPointer(DeviceAddress address, uint64_t bytes) override;
  absl::Status CopyToDevice(std::byte* device, const void* host, uint64_t bytes) override;
  absl::Status CopyToHost(void* host, const std::byte* device, uint64_t bytes) override;
  absl::Status CopyToDeviceOn(StreamHandle stream, std::byte* device, const void* host, uint64_t bytes) override;
  absl::Status CopyToHostOn(StreamHandle stream, void* host, const std::byte* device, uint64_t bytes) override;
  absl::Status Synchronize() override;

 private:
  CudaComputeDevice(std::unique_ptr<cuda::CudaBackend> backend, cublasHandle_t cublas);

  std::unique_ptr<cuda::CudaBackend> backend_;
  cublasHandle_t cublas_;
  std::unique_ptr<CudaKernels> kernels_;
};

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_CUDA_CUDA_COMPUTE_DEVICE_H_
