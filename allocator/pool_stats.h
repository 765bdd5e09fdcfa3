// The statistics as the caching allocator keeps them while it runs; GetStats
// turns them into a MemoryStats.
//
//   PoolStats stats;
//   stats.allocated_bytes.Increase(kSmallPoolStat, 4096);
//   stats.allocated_bytes.current();   // all pools: 4096
//
// Note [Pool statistics]: PyTorch's keys give every counter for all pools and
// for each pool. Only the two pools are stored; the all-pools current,
// allocated and freed values are their sums, and only the all-pools peak is
// kept apart (it is not the sum of the pools' peaks). A change then writes
// two fields instead of four, which matters on the allocate/free path, where
// about ten counters move per call (bench/allocator_bench.cc, BM_CachedPair).
#ifndef HEADROOM_ALLOCATOR_POOL_STATS_H_
#define HEADROOM_ALLOCATOR_POOL_STATS_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "allocator/memory_stats.h"
#include "allocator/shard_stats.h"

namespace headroom::internal {

// One counter of the small and the large pool.
class PooledStat {
 public:
  // `pool` is kSmallPoolStat or kLargePoolStat.
  void Increase(StatIndex pool, int64_t amount) {
    Stat& stat = PoolStat(pool);
    stat.Increase(amount);
    const int64_t all = current();
    if (all > all_peak_) all_peak_ = all;
  }
  void Decrease(StatIndex pool, int64_t amount) { PoolStat(pool).Decrease(amount); }
  // Increase(amount) or Decrease(-amount).
  void Change(StatIndex pool, int64_t amount) {
    if (amount >= 0) {
      Increase(pool, amount);
    } else {
      Decrease(pool, -amount);
    }
  }
  // For PoolStats::AddShard and Budget: a pool's counter (0 small, 1 large)
  // and the all-pools peak.
  Stat& pool_stat(size_t pool) { return pool == 0 ? small_ : large_; }
  const Stat& pool_stat(size_t pool) const { return pool == 0 ? small_ : large_; }
  int64_t all_peak() const { return all_peak_; }

  // All pools.
  int64_t current() const { return small_.current + large_.current; }
  int64_t peak() const { return all_peak_; }

  // {all pools, small pool, large pool}, as MemoryStats holds them.
  StatArray ToArray() const {
    StatArray array;
    array[kAllPools] = {.current = current(),
                        .peak = all_peak_,
                        .allocated = small_.allocated + large_.allocated,
                        .freed = small_.freed + large_.freed};
    array[kSmallPoolStat] = small_;
    array[kLargePoolStat] = large_;
    return array;
  }

  void ResetPeak() {
    small_.ResetPeak();
    large_.ResetPeak();
    all_peak_ = current();
  }
  void ResetAccumulated() {
    small_.ResetAccumulated();
    large_.ResetAccumulated();
  }

 private:
  Stat& PoolStat(StatIndex pool) { return pool == kSmallPoolStat ? small_ : large_; }

  Stat small_;
  Stat large_;
  int64_t all_peak_ = 0;
};

// The running counterpart of MemoryStats (same names and meanings).
struct PoolStats {
  PooledStat allocation;
  PooledStat segment;
  PooledStat active;
  PooledStat inactive_split;
  PooledStat allocated_bytes;
  PooledStat reserved_bytes;
  PooledStat active_bytes;
  PooledStat inactive_split_bytes;
  PooledStat requested_bytes;
  Stat oversize_allocations;
  Stat oversize_segments;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
  int64_t num_pages_mapped = 0;
  int64_t num_pages_unmapped = 0;
  int64_t num_stitched_blocks = 0;
  int64_t num_planned_allocs = 0;
  int64_t reserved_bytes_at_peak_allocated = 0;

  // One counter a fast-path call may change, by `amount` (negative: down).
  // Inline, so that a call with a constant `stat` is one field's update.
  void Change(BlockStat stat, StatIndex pool, int64_t amount) {
    switch (stat) {
      case BlockStat::kAllocation: return allocation.Change(pool, amount);
      case BlockStat::kAllocatedBytes: return allocated_bytes.Change(pool, amount);
      case BlockStat::kRequestedBytes: return requested_bytes.Change(pool, amount);
      case BlockStat::kActive: return active.Change(pool, amount);
      case BlockStat::kActiveBytes: return active_bytes.Change(pool, amount);
      case BlockStat::kInactiveSplit: return inactive_split.Change(pool, amount);
      case BlockStat::kInactiveSplitBytes: return inactive_split_bytes.Change(pool, amount);
      case BlockStat::kOversizeAllocations:
        if (amount >= 0) return oversize_allocations.Increase(amount);
        return oversize_allocations.Decrease(-amount);
    }
  }
  // Adds what a shard's fast path changed, and clears it (Note [Peak
  // budgets]: no peak moved meanwhile).
  void AddShard(ShardStats& shard);
  // Each counter's room below its peak ([0] small pool, [1] large pool,
  // [2] all pools), divided among `shards`.
  std::array<ShardStats::Counters, 3> Budget(size_t shards) const;

  // Every field that has a peak, and every accumulated total.
  void ResetPeaks();
  void ResetAccumulated();
  // The counters only; the caller adds what needs the pools (largest free
  // block, fragmentation) and the options (max_split_size).
  MemoryStats ToMemoryStats() const;

 private:
  template <typename Fn>
  void ForEachPooled(Fn&& fn) {
    for (PooledStat* stat : {&allocation, &segment, &active, &inactive_split, &allocated_bytes, &reserved_bytes,
                             &active_bytes, &inactive_split_bytes, &requested_bytes}) {
      fn(*stat);
    }
  }
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_POOL_STATS_H_
