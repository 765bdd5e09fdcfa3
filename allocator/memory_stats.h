// The caching allocator's statistics, with the keys and meanings of PyTorch's
// torch.cuda.memory_stats() so that dashboards and scripts written for
// PyTorch read Headroom's numbers unchanged.
//
//   MemoryStats stats = allocator->GetStats();
//   nlohmann::json flat = MemoryStatsToJson(stats);
//   flat["reserved_bytes.all.peak"]  // the peak of reserved memory
//
// Every counter is declared once as a Stat {current, peak, allocated, freed}
// and is either a COUNT (of blocks, segments, allocations) or a SUM of bytes;
// each field below says which. Each StatArray has three entries: all pools,
// the small pool (requests <= 1 MiB) and the large pool.
//
// Invariants (checked by CachingAllocator::Validate):
//   current == allocated - freed (until ResetAccumulated), peak >= current,
//   allocated_bytes <= active_bytes <= reserved_bytes.
#ifndef HEADROOM_ALLOCATOR_MEMORY_STATS_H_
#define HEADROOM_ALLOCATOR_MEMORY_STATS_H_

#include <array>
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace headroom {

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // total ever added
  int64_t freed = 0;      // total ever removed

  void Increase(int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void Decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void ResetPeak() { peak = current; }
  void ResetAccumulated() {
    allocated = 0;
    freed = 0;
  }
};

enum StatIndex : size_t { kAllPools = 0, kSmallPoolStat = 1, kLargePoolStat = 2 };
inline constexpr size_t kStatIndexCount = 3;
using StatArray = std::array<Stat, kStatIndexCount>;

struct MemoryStats {
  StatArray allocation;            // COUNT of blocks handed to callers
  StatArray segment;               // COUNT of device segments (Malloc'ed or VMM reservations)
  StatArray active;                // COUNT of blocks allocated or waiting on stream events
  StatArray inactive_split;        // COUNT of free blocks in a segment that is split
  StatArray allocated_bytes;       // SUM of allocated block sizes (after rounding)
  StatArray reserved_bytes;        // SUM of device memory held (Malloc'ed + mapped)
  StatArray active_bytes;          // SUM of active block sizes
  StatArray inactive_split_bytes;  // SUM of inactive split block sizes
  StatArray requested_bytes;       // SUM of the sizes callers asked for (before rounding)
  Stat oversize_allocations;       // COUNT of allocations >= max_split_size
  Stat oversize_segments;          // COUNT of segments >= max_split_size
  int64_t num_alloc_retries = 0;   // device allocations retried after freeing the cache
  int64_t num_ooms = 0;            // out-of-memory errors returned to callers
  int64_t num_sync_all_streams = 0;  // host waits on all pending frees (cache flushes)
  int64_t num_device_alloc = 0;    // Malloc + CreatePhysical calls
  int64_t num_device_free = 0;     // Free + ReleasePhysical calls
  int64_t num_pages_mapped = 0;    // expandable segments' pages mapped (new or moved)
  int64_t num_pages_unmapped = 0;  // and unmapped (released or moved)
  int64_t num_stitched_blocks = 0;  // blocks served from pieces of pages, mapped again (stitch_pages)
  int64_t num_planned_allocs = 0;   // allocations served where a layout plan put them (layout_plan)
  uint64_t max_split_size = 0;     // the option in force (0: unlimited, as PyTorch prints it)

  // Headroom additions, computed when the stats are taken.
  uint64_t largest_free_block_bytes = 0;  // largest cached (free, mapped) block
  uint64_t total_free_bytes = 0;          // reserved - active
  // 1 - largest_free / total_free: 0 when all free memory is one block, close
  // to 1 when it is scattered in small pieces. 0 when nothing is free.
  double external_fragmentation = 0;
  // reserved_bytes.all.current at the moment allocated_bytes.all reached its
  // peak, and that divided by the peak (1.0 = no overhead at peak).
  int64_t reserved_bytes_at_peak_allocated = 0;
  double reserved_to_allocated_at_peak = 0;
};

// A flat object with PyTorch's keys ("allocation.all.current",
// "reserved_bytes.large_pool.peak", "num_ooms", ...) plus Headroom's
// ("largest_free_block_bytes", "external_fragmentation", ...).
nlohmann::json MemoryStatsToJson(const MemoryStats& stats);

// A torch.cuda.memory_summary()-style table of the stats.
std::string MemorySummary(const MemoryStats& stats);

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_MEMORY_STATS_H_
