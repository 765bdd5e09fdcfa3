// The C ABI of allocator/cuda/c_abi/headroom_alloc.h: one CachingAllocator
// per device, created on first use over the backend that
// CreateDeviceBackend returns (c_abi_internal.h). Nothing here calls
// CUDA, so the CPU tests run this file over simulated devices.
#include "allocator/cuda/c_abi/headroom_alloc.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "allocator/alloc_conf.h"
#include "allocator/caching_allocator.h"
#include "allocator/cuda/c_abi/c_abi_internal.h"

namespace headroom::c_abi {

thread_local std::string last_error;

int Fail(const absl::Status& status) {
  last_error = std::string(status.message());
  return -1;
}

namespace {

constexpr int kMaxDevices = 64;

struct DeviceState {
  std::unique_ptr<DeviceBackend> backend;
  std::unique_ptr<CachingAllocator> allocator;
};

absl::Mutex init_mu;
std::array<std::atomic<DeviceState*>, kMaxDevices> states;  // never freed: lives as long as the process
std::array<std::string, kMaxDevices> init_errors ABSL_GUARDED_BY(init_mu);

absl::StatusOr<DeviceState*> CreateState(int device) {
  absl::StatusOr<std::unique_ptr<DeviceBackend>> backend = CreateDeviceBackend(device);
  if (!backend.ok()) return backend.status();
  // A preset's name (`headroom`, `expandable`, ...) or a conf string. Unset:
  // Headroom's own policy, or PyTorch's on a device without the virtual
  // memory API that expandable segments need.
  const char* env = std::getenv("HEADROOM_ALLOC_CONF");
  const char* fallback = (*backend)->properties().supports_virtual_memory ? "headroom" : "pytorch-default";
  absl::StatusOr<AllocatorOptions> options = ResolveAllocConf(env != nullptr ? env : fallback);
  if (!options.ok()) {
    return absl::Status(options.status().code(), absl::StrCat("HEADROOM_ALLOC_CONF ", options.status().message()));
  }
  auto state = std::make_unique<DeviceState>();
  state->backend = *std::move(backend);
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator =
      CachingAllocator::Create(state->backend.get(), *options);
  if (!allocator.ok()) return allocator.status();
  state->allocator = *std::move(allocator);
  return state.release();
}

// The allocator of `device`, created on first use. A failed creation is
// remembered: it is reported on every call rather than retried.
absl::StatusOr<CachingAllocator*> AllocatorFor(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrFormat("headroom: device %d out of range", device));
  }
  DeviceState* state = states[device].load(std::memory_order_acquire);
  if (state != nullptr) return state->allocator.get();
  absl::MutexLock lock(&init_mu);
  state = states[device].load(std::memory_order_acquire);
  if (state != nullptr) return state->allocator.get();
  if (!init_errors[device].empty()) return absl::FailedPreconditionError(init_errors[device]);
  absl::StatusOr<DeviceState*> created = CreateState(device);
  if (!created.ok()) {
    init_errors[device] = absl::StrFormat("headroom: cannot set up device %d: %s", device,
                                          std::string(created.status().message()));
    std::fprintf(stderr, "%s\n", init_errors[device].c_str());
    return absl::FailedPreconditionError(init_errors[device]);
  }
  states[device].store(*created, std::memory_order_release);
  return (*created)->allocator.get();
}

// Copies `text` into a caller's buffer (truncated, NUL-terminated) and
// returns its full length.
ssize_t CopyOut(const std::string& text, char* buffer, size_t capacity) {
  if (buffer != nullptr && capacity > 0) {
    const size_t n = std::min(capacity - 1, text.size());
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return static_cast<ssize_t>(text.size());
}

StreamHandle AsHandle(cudaStream_t stream) { return StreamHandle{reinterpret_cast<uintptr_t>(stream)}; }
DeviceAddress AsAddress(void* ptr) { return reinterpret_cast<uintptr_t>(ptr); }

}  // namespace
}  // namespace headroom::c_abi

using headroom::CachingAllocator;
using headroom::c_abi::AllocatorFor;
using headroom::c_abi::AsAddress;
using headroom::c_abi::AsHandle;
using headroom::c_abi::Fail;

extern "C" {

void* headroom_malloc(ssize_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  if (size < 0) {
    Fail(absl::InvalidArgumentError(absl::StrFormat("headroom_malloc: size %d is negative", size)));
    return nullptr;
  }
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) {
    Fail(allocator.status());
    return nullptr;
  }
  absl::StatusOr<headroom::DeviceAddress> address =
      (*allocator)->Allocate(static_cast<uint64_t>(size), AsHandle(stream));
  if (!address.ok()) {
    Fail(address.status());
    std::fprintf(stderr, "headroom: %s\n", headroom::c_abi::last_error.c_str());
    return nullptr;
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(*address));
}

void headroom_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
  if (ptr == nullptr) return;
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) {
    Fail(allocator.status());
    return;
  }
  const absl::Status status = (*allocator)->Free(
      AsAddress(ptr), size > 0 ? std::optional<uint64_t>(static_cast<uint64_t>(size)) : std::nullopt,
      AsHandle(stream));
  if (!status.ok()) {
    Fail(status);
    std::fprintf(stderr, "headroom: %s\n", headroom::c_abi::last_error.c_str());
  }
}

// The library's fields after the header, all 8 bytes wide, appended in
// later versions and never reordered: a caller's struct of `struct_size`
// bytes holds a prefix of them, whichever version it was compiled with.
constexpr size_t kStatsFieldsStart = offsetof(headroom_stats, allocated_bytes);
constexpr size_t kStatsFieldBytes = 8;
static_assert(kStatsFieldsStart == 2 * sizeof(uint32_t) && (sizeof(headroom_stats) - kStatsFieldsStart) % 8 == 0,
              "headroom_stats: a header of version and struct_size, then 8-byte fields only");

int headroom_get_stats(int device, headroom_stats* stats) {
  if (stats == nullptr) return Fail(absl::InvalidArgumentError("headroom_get_stats: stats is NULL"));
  if (stats->version == 0) {
    return Fail(absl::InvalidArgumentError(
        "headroom_get_stats: version 0; set version to HEADROOM_STATS_VERSION and struct_size to sizeof(headroom_stats)"));
  }
  if (stats->struct_size < kStatsFieldsStart + kStatsFieldBytes) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "headroom_get_stats: struct_size %d holds no statistics field (the first ends at byte %d); set it to "
        "sizeof(headroom_stats)",
        stats->struct_size, kStatsFieldsStart + kStatsFieldBytes)));
  }
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) return Fail(allocator.status());
  const headroom::MemoryStats s = (*allocator)->GetStats();
  constexpr size_t kAll = headroom::kAllPools;
  headroom_stats all{};
  all.allocated_bytes = s.allocated_bytes[kAll].current;
  all.allocated_bytes_peak = s.allocated_bytes[kAll].peak;
  all.reserved_bytes = s.reserved_bytes[kAll].current;
  all.reserved_bytes_peak = s.reserved_bytes[kAll].peak;
  all.active_bytes = s.active_bytes[kAll].current;
  all.requested_bytes = s.requested_bytes[kAll].current;
  all.inactive_split_bytes = s.inactive_split_bytes[kAll].current;
  all.allocations = s.allocation[kAll].current;
  all.segments = s.segment[kAll].current;
  all.num_alloc_retries = s.num_alloc_retries;
  all.num_ooms = s.num_ooms;
  all.num_device_alloc = s.num_device_alloc;
  all.num_device_free = s.num_device_free;
  all.largest_free_block_bytes = s.largest_free_block_bytes;
  all.external_fragmentation = s.external_fragmentation;
  all.num_pages_mapped = s.num_pages_mapped;
  all.num_pages_unmapped = s.num_pages_unmapped;
  all.num_stitched_blocks = s.num_stitched_blocks;
  all.num_planned_allocs = s.num_planned_allocs;
  // The fields both sides know: the whole fields inside the caller's struct,
  // up to the end of ours. The caller's version and struct_size stay as set.
  const size_t known = std::min<size_t>(stats->struct_size, sizeof(headroom_stats));
  const size_t fields_bytes = (known - kStatsFieldsStart) / kStatsFieldBytes * kStatsFieldBytes;
  std::memcpy(reinterpret_cast<char*>(stats) + kStatsFieldsStart,
              reinterpret_cast<const char*>(&all) + kStatsFieldsStart, fields_bytes);
  return 0;
}

int headroom_record_history(int device, size_t max_entries) {
  if (max_entries > headroom::kMaxHistoryEntries) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "headroom_record_history: max_entries %d is more than the limit of %d", max_entries,
        headroom::kMaxHistoryEntries)));
  }
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) return Fail(allocator.status());
  (*allocator)->SetHistoryCapacity(max_entries);
  return 0;
}

ssize_t headroom_snapshot_json(int device, char* buffer, size_t capacity) {
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) return Fail(allocator.status());
  return headroom::c_abi::CopyOut(headroom::SnapshotToJson((*allocator)->TakeSnapshot()).dump(), buffer, capacity);
}

ssize_t headroom_memory_summary(int device, char* buffer, size_t capacity) {
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) return Fail(allocator.status());
  return headroom::c_abi::CopyOut(headroom::MemorySummary((*allocator)->GetStats()), buffer, capacity);
}

ssize_t headroom_plan_departure(int device, char* buffer, size_t capacity) {
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) return Fail(allocator.status());
  return headroom::c_abi::CopyOut((*allocator)->PlanDeparture(), buffer, capacity);
}

int headroom_empty_cache(int device) {
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) return Fail(allocator.status());
  const absl::Status status = (*allocator)->EmptyCache();
  return status.ok() ? 0 : Fail(status);
}

int headroom_record_stream(void* ptr, int device, cudaStream_t stream) {
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) return Fail(allocator.status());
  const absl::Status status = (*allocator)->RecordStream(AsAddress(ptr), AsHandle(stream));
  return status.ok() ? 0 : Fail(status);
}

int headroom_set_memory_fraction(double fraction, int device) {
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) return Fail(allocator.status());
  const absl::Status status = (*allocator)->SetMemoryFraction(fraction);
  return status.ok() ? 0 : Fail(status);
}

int headroom_reset_peak_stats(int device) {
  absl::StatusOr<CachingAllocator*> allocator = AllocatorFor(device);
  if (!allocator.ok()) return Fail(allocator.status());
  (*allocator)->ResetPeakStats();
  return 0;
}

const char* headroom_last_error(void) { return headroom::c_abi::last_error.c_str(); }

}  // extern "C"
