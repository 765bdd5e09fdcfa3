// Where the executor's tensors live and its kernels run: the CPU reference
// over a simulated device whose memory is host memory (here), or a GPU
// (executor/cuda/cuda_compute_device.h). The executor allocates through the
// caching allocator over `backend()` and never touches memory except through
// the kernels and the copies below.
#ifndef HEADROOM_EXECUTOR_COMPUTE_DEVICE_H_
#define HEADROOM_EXECUTOR_COMPUTE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/device_backend.h"
#include "allocator/simulated/simulated_backend.h"
#include "executor/cpu_kernels.h"
#include "executor/host_pool.h"
#include "executor/kernels.h"

namespace headroom {

class ComputeDevice {
 public:
  virtual ~ComputeDevice() = default;

  virtual std::string name() const = 0;
  virtual DeviceBackend& backend() = 0;
  virtual const ExecutorKernels& kernels() const = 0;
  // Memory for host copies (pinned on a GPU): what the host pool is carved from.
  virtual std::unique_ptr<HostRegionSource> HostMemory() const = 0;

  // The pointer kernels get for [address, address + bytes) of device memory.
  virtual absl::StatusOr<std::byte*> KernelPointer(DeviceAddress address, uint64_t bytes) = 0;
  // Copies between host memory and kernel pointers, in order with the kernels queued before them; they
  // return when the copy is done.
  virtual absl::Status CopyToDevice(std::byte* device, const void* host, uint64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host, const std::byte* device, uint64_t bytes) = 0;
  // The same queued on `stream` of backend() (the executor's copy stream), in order with the work queued
  // there before; the caller orders the streams with events. The CPU reference copies at once.
  virtual absl::Status CopyToDeviceOn(StreamHandle stream, std::byte* device, const void* host, uint64_t bytes) = 0;
  virtual absl::Status CopyToHostOn(StreamHandle stream, void* host, const std::byte* device, uint64_t bytes) = 0;
  // Waits for the queued kernels; the first error any of them met.
  virtual absl::Status Synchronize() = 0;
};

// The CPU reference: CpuKernels over a SimulatedBackend of `capacity_bytes`
// with host backing. Copies and kernels run at once; what the allocator
// sees of the streams (the events it waits on before reusing a block a copy
// used) completes at once too, unless `copies_complete_at_once` is false:
// then it completes only when the host synchronizes, as copies that lag
// behind compute would.
class CpuComputeDevice final : public ComputeDevice {
 public:
  static absl::StatusOr<std::unique_ptr<CpuComputeDevice>> Create(uint64_t capacity_bytes,
                                                                  bool copies_complete_at_once = true);

  std::string name() const override { return "CPU reference (simulated device, host memory)"; }
  DeviceBackend& backend() override { return *backend_; }
  const ExecutorKernels& kernels() const override { return kernels_; }
  std::unique_ptr<HostRegionSource> HostMemory() const override { return PageableHostMemory(); }
  absl::StatusOr<std::byte*> KernelPointer(DeviceAddress address, uint64_t bytes) override;
  absl::Status CopyToDevice(std::byte* device, const void* host, uint64_t bytes) override;
  absl::Status CopyToHost(void* host, const std::byte* device, uint64_t bytes) override;
  absl::Status CopyToDeviceOn(StreamHandle, std::byte* device, const void* host, uint64_t bytes) override {
    return CopyToDevice(device, host, bytes);
  }
  absl::Status CopyToHostOn(StreamHandle, void* host, const std::byte* device, uint64_t bytes) override {
    return CopyToHost(host, device, bytes);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  explicit CpuComputeDevice(std::unique_ptr<SimulatedBackend> backend) : backend_(std::move(backend)) {}

  std::unique_ptr<SimulatedBackend> backend_;
  CpuKernels kernels_;
};

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_COMPUTE_DEVICE_H_
