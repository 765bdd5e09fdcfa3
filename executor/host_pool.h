// The host side of offload: one large region of host memory (pinned with
// cudaHostAlloc on a GPU machine, ordinary pages elsewhere) carved up by
// mimalloc's arena API, for offloaded activations, optimizer state and EMA
// weights. Pinning is slow (tens of milliseconds per call) and pinned pages
// cannot be swapped, so a framework pins once and suballocates; mimalloc does
// the suballocation with its size classes and free lists, and this class
// adds statistics in the device allocator's style and clear errors.
//
//   HEADROOM_ASSIGN_OR_RETURN(std::unique_ptr<HostPool> pool, HostPool::Create(256 * kMiB));
//   HEADROOM_ASSIGN_OR_RETURN(void* p, pool->Allocate(40 * kMiB));  // ResourceExhausted when full
//   HEADROOM_RETURN_IF_ERROR(pool->Free(p));                          // InvalidArgument on a double free
//   pool->stats().peak_bytes;
//
// Note [Host pool arenas]
// mi_manage_os_memory_ex hands mimalloc a region as an exclusive arena, and
// mi_heap_new_in_arena makes a heap that allocates only there, so the pool
// never spills into other memory: a full pool is a ResourceExhausted error.
// The region is declared as large OS pages (is_large), which mimalloc never
// decommits or resets: pinned pages must stay the pages the GPU's copy
// engines were given (an madvise would swap in fresh, unpinned ones), and a
// pageable pool keeps its pages committed the same way, so a steady
// offload loop does not fault them in again every step.
// mimalloc 2.0 wants the region aligned to its 32 MiB segments and at least
// one segment long, so the pool asks its source for the capacity rounded up
// to a segment plus one segment of slack, and manages the aligned part; its
// segment headers take a little of it. mimalloc cannot forget an arena, so a
// region stays with the process: a destroyed pool's region goes back to a
// process-wide free list, and the next pool of the same capacity and source
// reuses it instead of pinning more memory.
//
// Threads: a mimalloc heap allocates only from the thread that created it,
// so Allocate must be called from the thread that created the pool
// (FailedPrecondition otherwise); Free and stats are safe from any thread.
#ifndef HEADROOM_EXECUTOR_HOST_POOL_H_
#define HEADROOM_EXECUTOR_HOST_POOL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

struct mi_heap_s;

namespace headroom {

// Where a pool's region comes from.
class HostRegionSource {
 public:
  virtual ~HostRegionSource() = default;
  // "pageable" or "pinned": pools reuse regions of the same kind only.
  virtual std::string kind() const = 0;
  virtual absl::StatusOr<void*> Allocate(uint64_t bytes) = 0;
};

// Ordinary anonymous pages (mmap): the simulated device's host memory.
std::unique_ptr<HostRegionSource> PageableHostMemory();

// mimalloc's segment size: the arena alignment and granularity.
inline constexpr uint64_t kHostPoolSegment = uint64_t{32} << 20;
// Far beyond any host's memory; keeps the capacity's arithmetic exact.
inline constexpr uint64_t kMaxHostPoolBytes = uint64_t{1} << 44;  // 16 TiB

// Note [Host pool size]
// mimalloc serves an object of more than half a segment (16 MiB) from
// segments of its own and packs smaller ones into shared segments, so the
// copies live at once can need a whole segment each: a 256 MiB pool could not
// serve a 16 MiB copy with 128 MiB in use. A capacity that gives every copy
// its size in whole segments (with a 64 KiB slice for mimalloc's page header)
// plus one segment holds all of them at once, in any order of allocation.
// (Saturates at kMaxHostPoolBytes + 1, which Create refuses.)
uint64_t HostPoolBytesFor(std::span<const uint64_t> copies);

struct HostPoolStats {
  uint64_t capacity_bytes = 0;  // the region mimalloc manages
  uint64_t current_bytes = 0;   // requested bytes live now
  uint64_t peak_bytes = 0;      // most requested bytes live at once (since the last ResetPeak)
  uint64_t allocated_bytes = 0; // all bytes ever requested
  uint64_t freed_bytes = 0;
  uint64_t current_usable_bytes = 0;  // what mimalloc handed out for them (its size classes)
  uint64_t peak_usable_bytes = 0;
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t failures = 0;  // requests the pool could not serve
};

class HostPool {
 public:
  // `capacity` bytes in (0, kMaxHostPoolBytes], rounded up to kHostPoolSegment.
  // `source` defaults to PageableHostMemory(). Errors: InvalidArgument for the
  // capacity, the source's error, Internal if mimalloc refuses the region.
  static absl::StatusOr<std::unique_ptr<HostPool>> Create(uint64_t capacity,
                                                          std::unique_ptr<HostRegionSource> source = nullptr);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // 64-byte aligned memory inside the region. `bytes` == 0 is InvalidArgument;
  // ResourceExhausted names the request, the capacity and what is in use.
  absl::StatusOr<void*> Allocate(uint64_t bytes);
  // InvalidArgument for a pointer this pool did not hand out or already took back.
  absl::Status Free(void* pointer);
  // Whether `pointer` is a live allocation of this pool, and its requested size.
  absl::StatusOr<uint64_t> SizeOf(const void* pointer) const;

  HostPoolStats stats() const;
  void ResetPeak();
  std::string kind() const { return kind_; }

 private:
  HostPool(std::string kind, int arena, void* region, uint64_t capacity, mi_heap_s* heap);

  const std::string kind_;
  const int arena_;
  void* const region_;
  const uint64_t capacity_;
  mi_heap_s* const heap_;
  const std::thread::id owner_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<const void*, uint64_t> live_ ABSL_GUARDED_BY(mu_);
  HostPoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_HOST_POOL_H_
