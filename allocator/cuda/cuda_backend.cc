#include "allocator/cuda/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace headroom::cuda {
namespace {

absl::Status FromRuntime(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();  // clear non-sticky errors so later calls are unaffected
  const std::string message = absl::StrFormat("%s: %s (%s)", call, cudaGetErrorName(err), cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

absl::Status FromDriver(CUresult err, const char* call) {
  if (err == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = "unknown";
  const char* text = "";
  (void)cuGetErrorName(err, &name);
  (void)cuGetErrorString(err, &text);
  const std::string message = absl::StrFormat("%s: %s (%s)", call, name, text);
  if (err == CUDA_ERROR_OUT_OF_MEMORY) return absl::ResourceExhaustedError(message);
  if (err == CUDA_ERROR_NO_DEVICE || err == CUDA_ERROR_NOT_INITIALIZED) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

// Makes `device` current for the scope and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) status_ = FromRuntime(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && status_.ok()) (void)cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

CUmemAllocationProp PhysicalProperties(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

cudaStream_t AsStream(StreamHandle s) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s.value)); }
cudaEvent_t AsEvent(EventHandle e) { return reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(e.value)); }

}  // namespace

#define HEADROOM_CUDA_GUARD()                       \
  DeviceGuard guard(properties_.ordinal);           \
  HEADROOM_RETURN_IF_ERROR(guard.status())

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device) {
  int count = 0;
  HEADROOM_RETURN_IF_ERROR(FromRuntime(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrFormat("CUDA device %d does not exist (%d visible)", device, count));
  }
  DeviceGuard guard(device);
  HEADROOM_RETURN_IF_ERROR(guard.status());
  HEADROOM_RETURN_IF_ERROR(FromRuntime(cudaFree(nullptr), "cudaFree(0) (context creation)"));
  HEADROOM_RETURN_IF_ERROR(FromDriver(cuInit(0), "cuInit"));
  cudaDeviceProp props{};
  HEADROOM_RETURN_IF_ERROR(FromRuntime(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties"));
  CUdevice cu_device = 0;
  HEADROOM_RETURN_IF_ERROR(FromDriver(cuDeviceGet(&cu_device, device), "cuDeviceGet"));
  int vmm = 0;
  HEADROOM_RETURN_IF_ERROR(FromDriver(
      cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device),
      "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)"));
  size_t granularity = uint64_t{2} << 20;
  if (vmm != 0) {
    const CUmemAllocationProp prop = PhysicalProperties(device);
    HEADROOM_RETURN_IF_ERROR(FromDriver(
        cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity"));
  }
  return std::unique_ptr<CudaBackend>(new CudaBackend(DeviceProperties{.name = props.name,
                                                                       .ordinal = device,
                                                                       .total_bytes = props.totalGlobalMem,
                                                                       .map_granularity = granularity,
                                                                       .supports_virtual_memory = vmm != 0}));
}

absl::StatusOr<MemoryInfo> CudaBackend::GetMemoryInfo() {
  HEADROOM_CUDA_GUARD();
  size_t free_bytes = 0, total_bytes = 0;
  HEADROOM_RETURN_IF_ERROR(FromRuntime(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  return MemoryInfo{.free_bytes = free_bytes, .total_bytes = total_bytes};
}

absl::StatusOr<DeviceAddress> CudaBackend::Malloc(uint64_t bytes) {
  HEADROOM_CUDA_GUARD();
  void* ptr = nullptr;
  HEADROOM_RETURN_IF_ERROR(FromRuntime(cudaMalloc(&ptr, bytes), "cudaMalloc"));
  return reinterpret_cast<uintptr_t>(ptr);
}

absl::Status CudaBackend::Free(DeviceAddress address) {
  HEADROOM_CUDA_GUARD();
  return FromRuntime(cudaFree(reinterpret_cast<void*>(static_cast<uintptr_t>(address))), "cudaFree");
}

absl::StatusOr<DeviceAddress> CudaBackend::ReserveAddressRange(uint64_t bytes) {
  HEADROOM_CUDA_GUARD();
  CUdeviceptr ptr = 0;
  HEADROOM_RETURN_IF_ERROR(
      FromDriver(cuMemAddressReserve(&ptr, bytes, properties_.map_granularity, 0, 0), "cuMemAddressReserve"));
  return static_cast<DeviceAddress>(ptr);
}

absl::Status CudaBackend::ReleaseAddressRange(DeviceAddress address, uint64_t bytes) {
  HEADROOM_CUDA_GUARD();
  return FromDriver(cuMemAddressFree(static_cast<CUdeviceptr>(address), bytes), "cuMemAddressFree");
}

absl::StatusOr<PhysicalHandle> CudaBackend::CreatePhysical(uint64_t bytes) {
  HEADROOM_CUDA_GUARD();
  const CUmemAllocationProp prop = PhysicalProperties(properties_.ordinal);
  CUmemGenericAllocationHandle handle = 0;
  HEADROOM_RETURN_IF_ERROR(FromDriver(cuMemCreate(&handle, bytes, &prop, 0), "cuMemCreate"));
  return PhysicalHandle{static_cast<uint64_t>(handle)};
}

absl::Status CudaBackend::ReleasePhysical(PhysicalHandle handle) {
  HEADROOM_CUDA_GUARD();
  return FromDriver(cuMemRelease(static_cast<CUmemGenericAllocationHandle>(handle.value)), "cuMemRelease");
}

absl::Status CudaBackend::Map(DeviceAddress address, uint64_t bytes, PhysicalHandle handle) {
  HEADROOM_CUDA_GUARD();
  return FromDriver(cuMemMap(static_cast<CUdeviceptr>(address), bytes, 0,
                             static_cast<CUmemGenericAllocationHandle>(handle.value), 0),
                    "cuMemMap");
}

absl::Status CudaBackend::SetAccess(DeviceAddress address, uint64_t bytes) {
  HEADROOM_CUDA_GUARD();
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = properties_.ordinal;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return FromDriver(cuMemSetAccess(static_cast<CUdeviceptr>(address), bytes, &access, 1), "cuMemSetAccess");
}

absl::Status CudaBackend::Unmap(DeviceAddress address, uint64_t bytes) {
  HEADROOM_CUDA_GUARD();
  return FromDriver(cuMemUnmap(static_cast<CUdeviceptr>(address), bytes), "cuMemUnmap");
}

absl::StatusOr<StreamHandle> CudaBackend::CreateStream() {
  HEADROOM_CUDA_GUARD();
  cudaStream_t stream = nullptr;
  HEADROOM_RETURN_IF_ERROR(
      FromRuntime(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
  return StreamHandle{reinterpret_cast<uintptr_t>(stream)};
}

absl::Status CudaBackend::DestroyStream(StreamHandle stream) {
  HEADROOM_CUDA_GUARD();
  return FromRuntime(cudaStreamDestroy(AsStream(stream)), "cudaStreamDestroy");
}

absl::StatusOr<EventHandle> CudaBackend::CreateEvent() {
  HEADROOM_CUDA_GUARD();
  cudaEvent_t event = nullptr;
  HEADROOM_RETURN_IF_ERROR(
      FromRuntime(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
  return EventHandle{reinterpret_cast<uintptr_t>(event)};
}

absl::Status CudaBackend::DestroyEvent(EventHandle event) {
  HEADROOM_CUDA_GUARD();
  return FromRuntime(cudaEventDestroy(AsEvent(event)), "cudaEventDestroy");
}

absl::Status CudaBackend::RecordEvent(EventHandle event, StreamHandle stream) {
  HEADROOM_CUDA_GUARD();
  return FromRuntime(cudaEventRecord(AsEvent(event), AsStream(stream)), "cudaEventRecord");
}

absl::StatusOr<bool> CudaBackend::QueryEvent(EventHandle event) {
  HEADROOM_CUDA_GUARD();
  const cudaError_t err = cudaEventQuery(AsEvent(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  return FromRuntime(err, "cudaEventQuery");
}

absl::Status CudaBackend::SynchronizeEvent(EventHandle event) {
  HEADROOM_CUDA_GUARD();
  return FromRuntime(cudaEventSynchronize(AsEvent(event)), "cudaEventSynchronize");
}

absl::Status CudaBackend::SynchronizeStream(StreamHandle stream) {
  HEADROOM_CUDA_GUARD();
  return FromRuntime(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
}

absl::Status CudaBackend::SynchronizeDevice() {
  HEADROOM_CUDA_GUARD();
  return FromRuntime(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

absl::Status CudaBackend::StreamWaitEvent(StreamHandle stream, EventHandle event) {
  HEADROOM_CUDA_GUARD();
  return FromRuntime(cudaStreamWaitEvent(AsStream(stream), AsEvent(event), 0), "cudaStreamWaitEvent");
}

uint64_t CudaBackend::NowNanoseconds() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

#undef HEADROOM_CUDA_GUARD

}  // namespace headroom::cuda
