// The only seam between the caching allocator and a device.
//
// A DeviceBackend is the small, explicit set of driver operations the caching
// policy needs: plain malloc/free, the virtual-memory calls behind expandable
// segments (reserve an address range, create a physical handle, map, set
// access, unmap, release), memory info, streams and events, and a clock.
// SimulatedBackend implements it on any machine; CudaBackend (allocator/cuda/)
// with the CUDA runtime and driver API. The typed conformance suite in
// tests/allocator/backend_conformance.h holds both to the same contract.
//
//   std::unique_ptr<DeviceBackend> backend = ...;
//   HEADROOM_ASSIGN_OR_RETURN(DeviceAddress p, backend->Malloc(2 * kMiB));
//   HEADROOM_RETURN_IF_ERROR(backend->Free(p));
//
// Contract:
//  - Out of device memory is kResourceExhausted and nothing else is; the
//    allocator frees cached memory and retries only on that code.
//  - Map/Unmap/Reserve sizes and addresses are multiples of
//    properties().map_granularity; one Map maps one whole physical handle.
//    A handle may be mapped at several addresses at once, each showing the
//    same bytes (as cuMemMap allows; Note [Stitched blocks]).
//  - Streams and events are opaque handles; StreamHandle{0} is the default
//    stream and always exists. An event recorded on a stream completes when
//    the work queued before it on that stream has completed.
//  - Backends are safe to call from several threads.
#ifndef HEADROOM_ALLOCATOR_DEVICE_BACKEND_H_
#define HEADROOM_ALLOCATOR_DEVICE_BACKEND_H_

#include <compare>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace headroom {

// A device virtual address. Not a host pointer: only the backend (and, with
// host backing, SimulatedBackend::HostPointer) can turn it into memory.
using DeviceAddress = uint64_t;

// Distinct handle types so that a stream cannot be passed where an event is
// expected. `value` is backend-defined (CudaBackend stores the cudaStream_t /
// cudaEvent_t / CUmemGenericAllocationHandle bits).
template <typename Tag>
struct Handle {
  uint64_t value = 0;
  friend bool operator==(Handle, Handle) = default;
  friend auto operator<=>(Handle, Handle) = default;
  template <typename H>
  friend H AbslHashValue(H h, Handle handle) {
    return H::combine(std::move(h), handle.value);
  }
};
using StreamHandle = Handle<struct StreamTag>;
using EventHandle = Handle<struct EventTag>;
using PhysicalHandle = Handle<struct PhysicalTag>;

inline constexpr StreamHandle kDefaultStream{0};

struct DeviceProperties {
  std::string name;
  int ordinal = 0;
  uint64_t total_bytes = 0;
  // Page size of the virtual-memory API (cuMemGetAllocationGranularity).
  uint64_t map_granularity = uint64_t{2} << 20;
  bool supports_virtual_memory = true;
};

struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual const DeviceProperties& properties() const = 0;
  virtual absl::StatusOr<MemoryInfo> GetMemoryInfo() = 0;

  // cudaMalloc / cudaFree.
  virtual absl::StatusOr<DeviceAddress> Malloc(uint64_t bytes) = 0;
  virtual absl::Status Free(DeviceAddress address) = 0;

  // cuMemAddressReserve / cuMemAddressFree.
  virtual absl::StatusOr<DeviceAddress> ReserveAddressRange(uint64_t bytes) = 0;
  virtual absl::Status ReleaseAddressRange(DeviceAddress address, uint64_t bytes) = 0;
  // cuMemCreate / cuMemRelease. Physical memory is charged at creation.
  virtual absl::StatusOr<PhysicalHandle> CreatePhysical(uint64_t bytes) = 0;
  virtual absl::Status ReleasePhysical(PhysicalHandle handle) = 0;
  // cuMemMap / cuMemSetAccess / cuMemUnmap.
  virtual absl::Status Map(DeviceAddress address, uint64_t bytes, PhysicalHandle handle) = 0;
  virtual absl::Status SetAccess(DeviceAddress address, uint64_t bytes) = 0;
  virtual absl::Status Unmap(DeviceAddress address, uint64_t bytes) = 0;

  virtual absl::StatusOr<StreamHandle> CreateStream() = 0;
  virtual absl::Status DestroyStream(StreamHandle stream) = 0;
  virtual absl::StatusOr<EventHandle> CreateEvent() = 0;
  virtual absl::Status DestroyEvent(EventHandle event) = 0;
  virtual absl::Status RecordEvent(EventHandle event, StreamHandle stream) = 0;
  // Non-blocking: true once the work before the event's record has completed.
  virtual absl::StatusOr<bool> QueryEvent(EventHandle event) = 0;
  // The three calls below block the host; the allocator counts them.
  virtual absl::Status SynchronizeEvent(EventHandle event) = 0;
  virtual absl::Status SynchronizeStream(StreamHandle stream) = 0;
  virtual absl::Status SynchronizeDevice() = 0;
  // Device-side wait: work queued on `stream` after this call starts only
  // after `event` completes. The host does not block.
  virtual absl::Status StreamWaitEvent(StreamHandle stream, EventHandle event) = 0;

  // Monotonic nanoseconds; the allocator stamps its history with it.
  virtual uint64_t NowNanoseconds() = 0;
};

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_DEVICE_BACKEND_H_
