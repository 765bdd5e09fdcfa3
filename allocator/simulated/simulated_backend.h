// A DeviceBackend that simulates one GPU in host memory bookkeeping, so the
// whole caching policy runs and is tested on machines without a GPU, and so
// `headroom replay` can predict what a trace reserves on an 80 GiB device.
//
//   HEADROOM_ASSIGN_OR_RETURN(auto sim, SimulatedBackend::Create({
//       .capacity_bytes = 80 * kGiB, .auto_complete_events = false}));
//   sim->InjectFailure(BackendCall::kMalloc, {.skip = 2, .count = 1});
//   ... // the third Malloc fails with kResourceExhausted
//   sim->CompleteStream(stream);   // events recorded on `stream` complete
//
// What it models:
//  - Capacity: Malloc and CreatePhysical charge bytes against
//    `capacity_bytes`; beyond it they fail with kResourceExhausted.
//  - Addresses are deterministic: every Malloc and ReserveAddressRange takes
//    the next granularity-aligned range of a bump pointer (never reused), so
//    two runs of the same sequence see the same addresses.
//  - Streams and events: each stream counts the work items queued on it (one
//    per RecordEvent) and how many have completed. With
//    `auto_complete_events` every item completes at once; otherwise tests
//    complete them with CompleteStream/CompleteAll, or the host-blocking
//    Synchronize* calls do (and are counted as host synchronizations).
//  - Failure injection on every call (BackendCall), call counters, a clock
//    that advances `clock_step_ns` per call.
//  - Optional host backing: device memory gets real host bytes so tests can
//    write a pattern into each allocation and detect overlapping blocks, and
//    the executor can compute in it (Note [Host-backed mappings]).
//
// Note [Host-backed mappings]
// A Malloc gets its own host buffer. The virtual-memory calls are modelled
// as the CUDA driver runs them, with Linux's: a reservation is a range of
// inaccessible host address space (mmap PROT_NONE), a physical handle is a
// memory file (memfd) of its size, Map maps that file into the reservation
// at the same offset, and Unmap puts inaccessible space back. So a page's
// bytes follow its handle from one mapping to the next, and adjacent
// mappings are adjacent host memory: a block of an expandable segment that
// spans several pages is one contiguous host range.
//
// Strictness: the simulator rejects what the CUDA driver would reject and a
// little more (mapping over a mapping, unmapping part of a mapping, releasing
// a mapped handle or an address range that still has mappings), so allocator
// bugs surface as errors here.
#ifndef HEADROOM_ALLOCATOR_SIMULATED_SIMULATED_BACKEND_H_
#define HEADROOM_ALLOCATOR_SIMULATED_SIMULATED_BACKEND_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "allocator/device_backend.h"

namespace headroom {

enum class BackendCall {
  kGetMemoryInfo,
  kMalloc,
  kFree,
  kReserveAddressRange,
  kReleaseAddressRange,
  kCreatePhysical,
  kReleasePhysical,
  kMap,
  kSetAccess,
  kUnmap,
  kCreateStream,
  kDestroyStream,
  kCreateEvent,
  kDestroyEvent,
  kRecordEvent,
  kQueryEvent,
  kSynchronizeEvent,
  kSynchronizeStream,
  kSynchronizeDevice,
  kStreamWaitEvent,
};
inline constexpr size_t kBackendCallCount = static_cast<size_t>(BackendCall::kStreamWaitEvent) + 1;
std::string_view BackendCallName(BackendCall call);

// The largest capacity a simulated device may have: 64 PiB, 300,000 times
// today's largest GPU. Every byte count then fits the statistics' int64_t
// with room to spare, and the bump-pointer address space (64 bits, from
// `base_address`) holds a hundred expandable reservations of the largest
// device; one past the end is refused (kResourceExhausted), never wrapped.
inline constexpr uint64_t kMaxSimulatedCapacity = uint64_t{1} << 56;
// The largest address reservation: an expandable segment reserves more
// address space than the device has memory (sources/expandable_segments.cc).
inline constexpr uint64_t kMaxSimulatedReservation = 4 * kMaxSimulatedCapacity;

struct SimulatedBackendOptions {
  std::string name = "simulated";
  uint64_t capacity_bytes = uint64_t{80} << 30;  // at most kMaxSimulatedCapacity
  uint64_t map_granularity = uint64_t{2} << 20;
  bool supports_virtual_memory = true;
  // true: queued work completes immediately (a fast device). false: tests
  // decide when with CompleteStream/CompleteAll.
  bool auto_complete_events = true;
  bool host_backing = false;
  uint64_t base_address = uint64_t{0x7f00} << 32;
  uint64_t clock_step_ns = 1000;
};

// The next `count` calls of one kind, after `skip` successful ones, fail with
// `code`.
struct FailureSpec {
  int skip = 0;
  int count = 1;
  absl::StatusCode code = absl::StatusCode::kResourceExhausted;
};

class SimulatedBackend final : public DeviceBackend {
 public:
  static absl::StatusOr<std::unique_ptr<SimulatedBackend>> Create(SimulatedBackendOptions options);
  ~SimulatedBackend() override;

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

  // --- Test controls -------------------------------------------------------
  void InjectFailure(BackendCall call, FailureSpec spec);
  void ClearFailures();
  // Completes every work item queued so far on `stream` (and, first, the
  // items on other streams it was told to wait for). Not a host sync.
  void CompleteStream(StreamHandle stream);
  void CompleteAll();
  void AdvanceClock(uint64_t ns);

  // --- Observation ---------------------------------------------------------
  uint64_t CallCount(BackendCall call) const;
  // SynchronizeEvent + SynchronizeStream + SynchronizeDevice calls.
  uint64_t HostSynchronizations() const;
  uint64_t used_bytes() const;
  size_t live_mallocs() const;
  size_t live_physical_handles() const;
  size_t live_reservations() const;
  size_t live_events() const;
  // With host backing: write `value` into, or check that it is in, every
  // `stride`-th byte of [address, address + bytes), which must lie inside one
  // Malloc or a run of adjacent accessible mappings. Otherwise an error.
  // (A stride of 512 still catches any two overlapping allocator blocks.)
  absl::Status FillHost(DeviceAddress address, uint64_t bytes, uint8_t value, uint64_t stride = 1);
  absl::StatusOr<bool> HostEquals(DeviceAddress address, uint64_t bytes, uint8_t value, uint64_t stride = 1);
  // With host backing: the host bytes behind [address, address + bytes), for
  // code that computes on simulated device memory (the executor's CPU
  // reference). The range must lie inside one Malloc or a run of adjacent
  // accessible mappings (Note [Host-backed mappings]).
  absl::StatusOr<std::byte*> HostPointer(DeviceAddress address, uint64_t bytes);

 private:
  struct StreamState {
    uint64_t queued = 0;
    uint64_t completed = 0;
    // (stream, item) pairs that must complete before work queued after the
    // wait (i.e. items > `after`) may complete.
    struct Wait {
      uint64_t after = 0;
      StreamHandle on;
      uint64_t item = 0;
    };
    std::vector<Wait> waits;
  };
  struct EventState {
    bool recorded = false;
    StreamHandle stream;
    uint64_t item = 0;
  };
  struct Range {  // a Malloc, a reservation, or a mapping
    uint64_t bytes = 0;
    PhysicalHandle handle;  // mappings only
    bool accessible = false;
    std::byte* host = nullptr;
  };
  struct Physical {
    uint64_t bytes = 0;
    int map_count = 0;
    int fd = -1;  // with host backing: the memory file holding the page
  };

  explicit SimulatedBackend(SimulatedBackendOptions options);
  // Counts the call, advances the clock and applies injected failures.
  absl::Status Enter(BackendCall call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Charge(uint64_t bytes, std::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kResourceExhausted once the 64-bit address space is used up.
  absl::StatusOr<DeviceAddress> TakeAddresses(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteStreamLocked(StreamHandle stream, uint64_t up_to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EventDone(const EventState& event) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The reservation that contains [address, address + bytes), or nullptr.
  struct HostSpan {
    std::byte* data;
    uint64_t bytes;
  };
  absl::StatusOr<std::vector<HostSpan>> HostSpans(DeviceAddress address, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const std::pair<const DeviceAddress, Range>* FindReservation(DeviceAddress address, uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SimulatedBackendOptions options_;
  const DeviceProperties properties_;
  mutable absl::Mutex mu_;
  uint64_t clock_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_address_ ABSL_GUARDED_BY(mu_);
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::array<uint64_t, kBackendCallCount> calls_ ABSL_GUARDED_BY(mu_) = {};
  std::array<std::vector<FailureSpec>, kBackendCallCount> failures_ ABSL_GUARDED_BY(mu_);
  std::map<DeviceAddress, Range> mallocs_ ABSL_GUARDED_BY(mu_);
  std::map<DeviceAddress, std::unique_ptr<std::byte[]>> malloc_host_ ABSL_GUARDED_BY(mu_);
  std::map<DeviceAddress, Range> reservations_ ABSL_GUARDED_BY(mu_);
  std::map<DeviceAddress, Range> mappings_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Physical> physical_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<StreamHandle, StreamState> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<EventHandle, EventState> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_SIMULATED_SIMULATED_BACKEND_H_
