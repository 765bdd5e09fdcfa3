#include "allocator/limiting_backend.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {

LimitingBackend::LimitingBackend(DeviceBackend* backend, MemoryLimit limit)
    : backend_(backend),
      total_bytes_(backend->properties().total_bytes),
      hard_limit_bytes_(limit.hard_limit_bytes),
      memory_fraction_(limit.memory_fraction) {}

uint64_t LimitingBackend::AllowedBytes() const {
  internal::MutexLock lock(&mu_);
  return AllowedBytesLocked();
}

uint64_t LimitingBackend::AllowedBytesLocked() const {
  uint64_t allowed = static_cast<uint64_t>(std::floor(static_cast<double>(total_bytes_) * memory_fraction_));
  if (hard_limit_bytes_ != 0) allowed = std::min(allowed, hard_limit_bytes_);
  return allowed;
}

bool LimitingBackend::FitsLocked(uint64_t bytes) const {
  const uint64_t allowed = AllowedBytesLocked();
  return bytes <= allowed && alive_bytes_ <= allowed - bytes;
}

double LimitingBackend::memory_fraction() const {
  internal::MutexLock lock(&mu_);
  return memory_fraction_;
}

void LimitingBackend::SetMemoryFraction(double fraction) {
  internal::MutexLock lock(&mu_);
  memory_fraction_ = fraction;
}

uint64_t LimitingBackend::alive_bytes() const {
  internal::MutexLock lock(&mu_);
  return alive_bytes_;
}

absl::Status LimitingBackend::RoomLocked(uint64_t bytes, Request request) const {
  if (FitsLocked(bytes)) return absl::OkStatus();
  const std::string limit = FormatBytes(AllowedBytesLocked());
  return absl::ResourceExhaustedError(
      request == Request::kSegment
          ? absl::StrFormat("a %s segment would exceed the limit of %s", FormatBytes(bytes), limit)
          : absl::StrFormat("mapping %s more would exceed the limit of %s", FormatBytes(bytes), limit));
}

absl::Status LimitingBackend::CheckRoom(uint64_t bytes) const {
  internal::MutexLock lock(&mu_);
  return RoomLocked(bytes, Request::kMapping);
}

absl::StatusOr<DeviceAddress> LimitingBackend::Malloc(uint64_t bytes) {
  internal::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(RoomLocked(bytes, Request::kSegment));
  HEADROOM_ASSIGN_OR_RETURN(DeviceAddress address, backend_->Malloc(bytes));
  malloc_bytes_[address] = bytes;
  alive_bytes_ += bytes;
  return address;
}

absl::Status LimitingBackend::Free(DeviceAddress address) {
  internal::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(backend_->Free(address));
  if (auto it = malloc_bytes_.find(address); it != malloc_bytes_.end()) {
    alive_bytes_ -= it->second;
    malloc_bytes_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<PhysicalHandle> LimitingBackend::CreatePhysical(uint64_t bytes) {
  internal::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(RoomLocked(bytes, Request::kMapping));
  HEADROOM_ASSIGN_OR_RETURN(PhysicalHandle handle, backend_->CreatePhysical(bytes));
  physical_bytes_[handle] = bytes;
  alive_bytes_ += bytes;
  return handle;
}

absl::Status LimitingBackend::ReleasePhysical(PhysicalHandle handle) {
  internal::MutexLock lock(&mu_);
  HEADROOM_RETURN_IF_ERROR(backend_->ReleasePhysical(handle));
  if (auto it = physical_bytes_.find(handle); it != physical_bytes_.end()) {
    alive_bytes_ -= it->second;
    physical_bytes_.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace headroom
