// A DeviceBackend decorator that holds an allocator's reservation limit
// (memory_fraction and hard_limit_bytes): it counts the device memory alive
// through it (ranges from Malloc, physical handles from CreatePhysical) and
// refuses, as kResourceExhausted, a Malloc or CreatePhysical that would take
// the count past the limit, before the device is asked. Every other call
// goes straight to the wrapped backend. RMM's limiting_resource_adaptor does
// the same for a memory resource.
//
//   LimitingBackend limited(&device, {.memory_fraction = 0.5});
//   absl::StatusOr<DeviceAddress> p = limited.Malloc(size);   // ResourceExhausted past half the device
//   limited.SetMemoryFraction(0.75);
//
// The caching allocator owns one over the backend it is given (Note [Out of
// memory]: a limit counts as the device refusing). Its count equals the
// allocator's reserved_bytes at every exclusive call's end, which
// CachingAllocator::Validate checks: pages moved between segments (Note
// [Moving free pages]) and pages the device would not release (Note
// [Unreleased pages]) stay alive in both. A batch of pages is checked
// whole with CheckRoom before the first is created, so that a batch that
// cannot fit creates none.
//
// Thread-safe, as every backend; the wrapped backend is not owned and must
// outlive it.
#ifndef HEADROOM_ALLOCATOR_LIMITING_BACKEND_H_
#define HEADROOM_ALLOCATOR_LIMITING_BACKEND_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/annotated_mutex.h"
#include "allocator/device_backend.h"

namespace headroom {

struct MemoryLimit {
  // Fraction of the device's total memory that may be alive, in (0, 1].
  double memory_fraction = 1.0;
  // Absolute cap on the bytes alive; 0: none. The stricter of the two applies.
  uint64_t hard_limit_bytes = 0;
};

class LimitingBackend final : public DeviceBackend {
 public:
  LimitingBackend(DeviceBackend* backend, MemoryLimit limit);
  LimitingBackend(const LimitingBackend&) = delete;
  LimitingBackend& operator=(const LimitingBackend&) = delete;

  // The bytes that may be alive: the device's total times memory_fraction,
  // rounded down, and at most hard_limit_bytes.
  uint64_t AllowedBytes() const;
  double memory_fraction() const;
  uint64_t hard_limit_bytes() const { return hard_limit_bytes_; }
  // `fraction` in (0, 1] (the caller checks it).
  void SetMemoryFraction(double fraction);
  // Bytes of Malloc'ed ranges and physical handles alive.
  uint64_t alive_bytes() const;
  // OK if `bytes` more fit within the limit; else the ResourceExhausted error
  // a CreatePhysical past it returns.
  absl::Status CheckRoom(uint64_t bytes) const;

  const DeviceProperties& properties() const override { return backend_->properties(); }
  absl::StatusOr<MemoryInfo> GetMemoryInfo() override { return backend_->GetMemoryInfo(); }
  absl::StatusOr<DeviceAddress> Malloc(uint64_t bytes) override;
  absl::Status Free(DeviceAddress address) override;
  absl::StatusOr<DeviceAddress> ReserveAddressRange(uint64_t bytes) override {
    return backend_->ReserveAddressRange(bytes);
  }
  absl::Status ReleaseAddressRange(DeviceAddress address, uint64_t bytes) override {
    return backend_->ReleaseAddressRange(address, bytes);
  }
  absl::StatusOr<PhysicalHandle> CreatePhysical(uint64_t bytes) override;
  absl::Status ReleasePhysical(PhysicalHandle handle) override;
  absl::Status Map(DeviceAddress address, uint64_t bytes, PhysicalHandle handle) override {
    return backend_->Map(address, bytes, handle);
  }
  absl::Status SetAccess(DeviceAddress address, uint64_t bytes) override {
    return backend_->SetAccess(address, bytes);
  }
  absl::Status Unmap(DeviceAddress address, uint64_t bytes) override { return backend_->Unmap(address, bytes); }
  absl::StatusOr<StreamHandle> CreateStream() override { return backend_->CreateStream(); }
  absl::Status DestroyStream(StreamHandle stream) override { return backend_->DestroyStream(stream); }
  absl::StatusOr<EventHandle> CreateEvent() override { return backend_->CreateEvent(); }
  absl::Status DestroyEvent(EventHandle event) override { return backend_->DestroyEvent(event); }
  absl::Status RecordEvent(EventHandle event, StreamHandle stream) override {
    return backend_->RecordEvent(event, stream);
  }
  absl::StatusOr<bool> QueryEvent(EventHandle event) override { return backend_->QueryEvent(event); }
  absl::Status SynchronizeEvent(EventHandle event) override { return backend_->SynchronizeEvent(event); }
  absl::Status SynchronizeStream(StreamHandle stream) override { return backend_->SynchronizeStream(stream); }
  absl::Status SynchronizeDevice() override { return backend_->SynchronizeDevice(); }
  absl::Status StreamWaitEvent(StreamHandle stream, EventHandle event) override {
    return backend_->StreamWaitEvent(stream, event);
  }
  uint64_t NowNanoseconds() override { return backend_->NowNanoseconds(); }

 private:
  uint64_t AllowedBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `bytes` more fit within the limit.
  bool FitsLocked(uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK, or the error saying that the segment or mapping of `bytes` would exceed the limit.
  enum class Request { kSegment, kMapping };
  absl::Status RoomLocked(uint64_t bytes, Request request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  DeviceBackend* const backend_;
  const uint64_t total_bytes_;
  const uint64_t hard_limit_bytes_;
  mutable internal::Mutex mu_;
  double memory_fraction_ ABSL_GUARDED_BY(mu_);
  uint64_t alive_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<DeviceAddress, uint64_t> malloc_bytes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PhysicalHandle, uint64_t> physical_bytes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_LIMITING_BACKEND_H_
