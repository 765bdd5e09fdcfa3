// DeviceBackend on a real GPU: the CUDA runtime for plain allocations,
// streams and events, and the driver's virtual memory management API
// (cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess /
// cuMemUnmap / cuMemRelease) for expandable segments.
//
//   HEADROOM_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> gpu, CudaBackend::Create(/*device=*/0));
//   HEADROOM_ASSIGN_OR_RETURN(auto allocator, CachingAllocator::Create(gpu.get(), options));
//
// Handles carry the CUDA objects' bits: StreamHandle{reinterpret_cast<
// uintptr_t>(cudaStream_t)} (0 is the legacy default stream), EventHandle the
// cudaEvent_t, PhysicalHandle the CUmemGenericAllocationHandle. Every call
// makes the backend's device current for its duration and restores the
// caller's. cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY become
// kResourceExhausted; other errors kInternal (kUnavailable when there is no
// driver), with the CUDA error name in the message.
#ifndef HEADROOM_ALLOCATOR_CUDA_CUDA_BACKEND_H_
#define HEADROOM_ALLOCATOR_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "allocator/device_backend.h"

namespace headroom::cuda {

class CudaBackend final : public DeviceBackend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device);

  const DeviceProperties& properties() const override { return properties_; }
  absl::StatusOr<MemoryInfo> GetMemoryInfo() override;
  absl::StatusOr<DeviceAddress> Malloc(uint64_t bytes) override;
  absl::Status Free(DeviceAddress address) override;
  absl::StatusOr<DeviceAddress> ReserveAddressRange(uint64_t bytes) override;
  absl::Status ReleaseAddressRange(DeviceAddress address, uint64_t bytes) override;
  absl::StatusOr<PhysicalHandle> CreatePhysical(uint64_t bytes) override;
  absl::Status ReleasePhysical(PhysicalHandle handle) override;
  absl::Status Map(DeviceAddress address, uint64_t bytes, PhysicalHandle handle) override;
  absl::Status SetAccess(DeviceAddress address, uint64_t bytes) override;
  absl::Status Unmap(DeviceAddress address, uint64_t bytes) override;
  absl::StatusOr<StreamHandle> CreateStream() override;
  absl::Status DestroyStream(StreamHandle stream) override;
  absl::StatusOr<EventHandle> CreateEvent() override;
  absl::Status DestroyEvent(EventHandle event) override;
  absl::Status RecordEvent(EventHandle event, StreamHandle stream) override;
  absl::StatusOr<bool> QueryEvent(EventHandle event) override;
  absl::Status SynchronizeEvent(EventHandle event) override;
  absl::Status SynchronizeStream(StreamHandle stream) override;
  absl::Status SynchronizeDevice() override;
  absl::Status StreamWaitEvent(StreamHandle stream, EventHandle event) override;
  uint64_t NowNanoseconds() override;

  int device() const { return properties_.ordinal; }

 private:
  explicit CudaBackend(DeviceProperties properties) : properties_(std::move(properties)) {}
  const DeviceProperties properties_;
};

}  // namespace headroom::cuda

#endif  // HEADROOM_ALLOCATOR_CUDA_CUDA_BACKEND_H_
