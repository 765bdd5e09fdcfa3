#include "executor/compute_device.h"

#include <cstring>
#include <utility>

#include "common/status_macros.h"

namespace headroom {

absl::StatusOr<std::unique_ptr<CpuComputeDevice>> CpuComputeDevice::Create(uint64_t capacity_bytes,
                                                                           bool copies_complete_at_once) {
  HEADROOM_ASSIGN_OR_RETURN(std::unique_ptr<SimulatedBackend> backend,
                            SimulatedBackend::Create({.name = "simulated (host-backed)",
                                                      .capacity_bytes = capacity_bytes,
                                                      .auto_complete_events = copies_complete_at_once,
                                                      .host_backing = true}));
  return std::unique_ptr<CpuComputeDevice>(new CpuComputeDevice(std::move(backend)));
}

absl::StatusOr<std::byte*> CpuComputeDevice::KernelPointer(DeviceAddress address, uint64_t bytes) {
  return backend_->HostPointer(address, bytes);
}

absl::Status CpuComputeDevice::CopyToDevice(std::byte* device, const void* host, uint64_t bytes) {
  std::memcpy(device, host, bytes);
  return absl::OkStatus();
}

absl::Status CpuComputeDevice::CopyToHost(void* host, const std::byte* device, uint64_t bytes) {
  std::memcpy(host, device, bytes);
  return absl::OkStatus();
}

}  // namespace headroom
