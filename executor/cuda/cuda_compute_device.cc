#include "executor/cuda/cuda_compute_device.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {
namespace {

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s", what, cudaGetErrorString(e)));
}

class PinnedSource final : public HostRegionSource {
 public:
  std::string kind() const override { return "pinned"; }
  absl::StatusOr<void*> Allocate(uint64_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("host pool: cudaHostAlloc of %s: %s", FormatBytes(bytes), cudaGetErrorString(e)));
    }
    return p;
  }
};

}  // namespace

std::unique_ptr<HostRegionSource> PinnedHostMemory() { return std::make_unique<PinnedSource>(); }

absl::StatusOr<std::unique_ptr<CudaComputeDevice>> CudaComputeDevice::Create(int device) {
  HEADROOM_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaBackend> backend, cuda::CudaBackend::Create(device));
  HEADROOM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  cublasHandle_t cublas = nullptr;
  if (const cublasStatus_t s = cublasCreate(&cublas); s != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrFormat("cublasCreate: %s", cublasGetStatusString(s)));
  }
  // Full FP32, as the CPU reference computes: no TF32 tensor cores.
  cublasSetMathMode(cublas, CUBLAS_PEDANTIC_MATH);
  return std::unique_ptr<CudaComputeDevice>(new CudaComputeDevice(std::move(backend), cublas));
}

CudaComputeDevice::CudaComputeDevice(std::unique_ptr<cuda::CudaBackend> backend, cublasHandle_t cublas)
    : backend_(std::move(backend)), cublas_(cublas), kernels_(std::make_unique<CudaKernels>(cublas)) {}

CudaComputeDevice::~CudaComputeDevice() {
  cudaDeviceSynchronize();
  cublasDestroy(cublas_);
}

std::string CudaComputeDevice::name() const { return backend_->properties().name; }

absl::StatusOr<std::byte*> CudaComputeDevice::KernelPointer(DeviceAddress address, uint64_t) {
  return reinterpret_cast<std::byte*>(address);  // device memory is addressed by its pointer
}

absl::Status CudaComputeDevice::CopyToDevice(std::byte* device, const void* host, uint64_t bytes) {
  return CudaStatus(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}

absl::Status CudaComputeDevice::CopyToHost(void* host, const std::byte* device, uint64_t bytes) {
  return CudaStatus(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}

absl::Status CudaComputeDevice::CopyToDeviceOn(StreamHandle stream, std::byte* device, const void* host,
                                               uint64_t bytes) {
  return CudaStatus(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice,
                                    reinterpret_cast<cudaStream_t>(stream.value)),
                    "cudaMemcpyAsync to the device");
}

absl::Status CudaComputeDevice::CopyToHostOn(StreamHandle stream, void* host, const std::byte* device,
                                             uint64_t bytes) {
  return CudaStatus(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost,
                                    reinterpret_cast<cudaStream_t>(stream.value)),
                    "cudaMemcpyAsync to the host");
}

absl::Status CudaComputeDevice::Synchronize() {
  HEADROOM_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  return kernels_->TakeError();
}

}  // namespace headroom
