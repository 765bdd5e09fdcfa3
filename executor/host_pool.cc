#include "executor/host_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "mimalloc.h"

namespace headroom {
namespace {

class PageableSource final : public HostRegionSource {
 public:
  std::string kind() const override { return "pageable"; }
  absl::StatusOr<void*> Allocate(uint64_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("host pool: cannot map %s of host memory: %s", FormatBytes(bytes), std::strerror(errno)));
    }
    return p;
  }
};

// Note [Host pool arenas]: regions mimalloc manages, kept for the process.
struct Region {
  std::string kind;
  uint64_t capacity = 0;
  int arena = 0;
  void* start = nullptr;
};

absl::Mutex regions_mu;
std::vector<Region>& IdleRegions() ABSL_EXCLUSIVE_LOCKS_REQUIRED(regions_mu) {
  static auto* idle = new std::vector<Region>();
  return *idle;
}

}  // namespace

std::unique_ptr<HostRegionSource> PageableHostMemory() { return std::make_unique<PageableSource>(); }

uint64_t HostPoolBytesFor(std::span<const uint64_t> copies) {
  constexpr uint64_t kPageHeader = uint64_t{64} << 10;
  uint64_t bytes = kHostPoolSegment;
  for (uint64_t copy : copies) {
    if (copy > kMaxHostPoolBytes) return kMaxHostPoolBytes + 1;
    bytes += (copy + kPageHeader + kHostPoolSegment - 1) / kHostPoolSegment * kHostPoolSegment;
    if (bytes > kMaxHostPoolBytes) return kMaxHostPoolBytes + 1;
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<HostPool>> HostPool::Create(uint64_t capacity,
                                                           std::unique_ptr<HostRegionSource> source) {
  if (capacity == 0 || capacity > kMaxHostPoolBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("host pool: capacity %d bytes is not in (0, %s]", capacity,
                                                      FormatBytes(kMaxHostPoolBytes)));
  }
  if (source == nullptr) source = PageableHostMemory();
  const uint64_t managed = (capacity + kHostPoolSegment - 1) / kHostPoolSegment * kHostPoolSegment;
  Region region;
  {
    absl::MutexLock lock(&regions_mu);
    std::vector<Region>& idle = IdleRegions();
    auto it = std::find_if(idle.begin(), idle.end(), [&](const Region& r) {
      return r.kind == source->kind() && r.capacity == managed;
    });
    if (it != idle.end()) {
      region = *it;
      idle.erase(it);
    }
  }
  if (region.start == nullptr) {
    HEADROOM_ASSIGN_OR_RETURN(void* raw, source->Allocate(managed + kHostPoolSegment));
    const auto address = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (address + kHostPoolSegment - 1) / kHostPoolSegment * kHostPoolSegment;
    region = {.kind = source->kind(), .capacity = managed, .start = reinterpret_cast<void*>(aligned)};
    mi_arena_id_t arena = 0;
    if (!mi_manage_os_memory_ex(region.start, managed, /*is_committed=*/true, /*is_large=*/true,
                                /*is_zero=*/false, /*numa_node=*/-1, /*exclusive=*/true, &arena)) {
      return absl::InternalError(absl::StrFormat("host pool: mimalloc refused a %s region", FormatBytes(managed)));
    }
    region.arena = arena;
  }
  mi_heap_t* heap = mi_heap_new_in_arena(region.arena);
  if (heap == nullptr) {
    absl::MutexLock lock(&regions_mu);
    IdleRegions().push_back(region);
    return absl::InternalError("host pool: mimalloc could not create a heap in its arena");
  }
  return std::unique_ptr<HostPool>(new HostPool(region.kind, region.arena, region.start, managed, heap));
}

HostPool::HostPool(std::string kind, int arena, void* region, uint64_t capacity, mi_heap_s* heap)
    : kind_(std::move(kind)),
      arena_(arena),
      region_(region),
      capacity_(capacity),
      heap_(heap),
      owner_(std::this_thread::get_id()) {
  stats_.capacity_bytes = capacity;
}

HostPool::~HostPool() {
  mi_heap_destroy(heap_);  // frees every block still live
  absl::MutexLock lock(&regions_mu);
  IdleRegions().push_back({.kind = kind_, .capacity = capacity_, .arena = arena_, .start = region_});
}

absl::StatusOr<void*> HostPool::Allocate(uint64_t bytes) {
  if (std::this_thread::get_id() != owner_) {
    return absl::FailedPreconditionError("host pool: Allocate from a thread other than the one that created it");
  }
  if (bytes == 0) return absl::InvalidArgumentError("host pool: a request for 0 bytes");
  absl::MutexLock lock(&mu_);
  void* p = bytes <= capacity_ ? mi_heap_malloc_aligned(heap_, bytes, 64) : nullptr;
  if (p == nullptr) {
    ++stats_.failures;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "host pool (%s, %s): cannot serve %s with %s in use (%s as mimalloc serves it, peak %s)", kind_,
        FormatBytes(capacity_), FormatBytes(bytes), FormatBytes(stats_.current_bytes),
        FormatBytes(stats_.current_usable_bytes), FormatBytes(stats_.peak_bytes)));
  }
  live_.emplace(p, bytes);
  stats_.current_bytes += bytes;
  stats_.allocated_bytes += bytes;
  stats_.current_usable_bytes += mi_usable_size(p);
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  stats_.peak_usable_bytes = std::max(stats_.peak_usable_bytes, stats_.current_usable_bytes);
  ++stats_.allocations;
  return p;
}

absl::Status HostPool::Free(void* pointer) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(pointer);
  if (it == live_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host pool: free of %p, which is not a live allocation of this pool (a double free, or another pool's)",
        pointer));
  }
  stats_.current_bytes -= it->second;
  stats_.freed_bytes += it->second;
  stats_.current_usable_bytes -= mi_usable_size(pointer);
  ++stats_.frees;
  live_.erase(it);
  mi_free(pointer);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HostPool::SizeOf(const void* pointer) const {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(pointer);
  if (it == live_.end()) {
    return absl::NotFoundError(absl::StrFormat("host pool: %p is not a live allocation of this pool", pointer));
  }
  return it->second;
}

HostPoolStats HostPool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void HostPool::ResetPeak() {
  absl::MutexLock lock(&mu_);
  stats_.peak_bytes = stats_.current_bytes;
  stats_.peak_usable_bytes = stats_.current_usable_bytes;
}

}  // namespace headroom
