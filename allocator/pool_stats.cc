#include "allocator/pool_stats.h"

#include <array>
#include <tuple>
#include <utility>

namespace headroom::internal {

namespace {

constexpr auto kOversize = static_cast<size_t>(BlockStat::kOversizeAllocations);

// The pooled counters a fast-path call changes, in BlockStat order.
template <typename Stats>
auto BlockCounters(Stats& stats) {
  return std::array{&stats.allocation, &stats.allocated_bytes, &stats.requested_bytes, &stats.active,
                    &stats.active_bytes, &stats.inactive_split, &stats.inactive_split_bytes};
}
static_assert(std::tuple_size_v<decltype(BlockCounters(std::declval<PoolStats&>()))> == kOversize);

}  // namespace

void PoolStats::AddShard(ShardStats& shard) {
  const auto pooled = BlockCounters(*this);
  for (size_t pool = 0; pool < 2; ++pool) {
    for (size_t i = 0; i < kOversize; ++i) {
      Stat& stat = pooled[i]->pool_stat(pool);
      stat.current += shard.net(pool)[i];
      stat.allocated += shard.increased(pool)[i];
      stat.freed += shard.decreased(pool)[i];
    }
    oversize_allocations.current += shard.net(pool)[kOversize];
    oversize_allocations.allocated += shard.increased(pool)[kOversize];
    oversize_allocations.freed += shard.decreased(pool)[kOversize];
  }
  shard.Clear();
}

std::array<ShardStats::Counters, 3> PoolStats::Budget(size_t shards) const {
  const auto pooled = BlockCounters(*this);
  const auto share = [shards](int64_t room) { return room / static_cast<int64_t>(shards); };
  std::array<ShardStats::Counters, 3> budget{};
  for (size_t i = 0; i < kOversize; ++i) {
    for (size_t pool = 0; pool < 2; ++pool) {
      budget[pool][i] = share(pooled[i]->pool_stat(pool).peak - pooled[i]->pool_stat(pool).current);
    }
    budget[2][i] = share(pooled[i]->peak() - pooled[i]->current());
  }
  // One counter for both pools: only its all-pools budget binds.
  const int64_t oversize_room = share(oversize_allocations.peak - oversize_allocations.current);
  for (auto& pool_budget : budget) pool_budget[kOversize] = oversize_room;
  return budget;
}

void PoolStats::ResetPeaks() {
  ForEachPooled([](PooledStat& stat) { stat.ResetPeak(); });
  oversize_allocations.ResetPeak();
  oversize_segments.ResetPeak();
  reserved_bytes_at_peak_allocated = reserved_bytes.current();
}

void PoolStats::ResetAccumulated() {
  ForEachPooled([](PooledStat& stat) { stat.ResetAccumulated(); });
  oversize_allocations.ResetAccumulated();
  oversize_segments.ResetAccumulated();
  num_alloc_retries = 0;
  num_ooms = 0;
  num_sync_all_streams = 0;
  num_device_alloc = 0;
  num_device_free = 0;
  num_pages_mapped = 0;
  num_pages_unmapped = 0;
  num_stitched_blocks = 0;
  num_planned_allocs = 0;
}

MemoryStats PoolStats::ToMemoryStats() const {
  return MemoryStats{.allocation = allocation.ToArray(),
                     .segment = segment.ToArray(),
                     .active = active.ToArray(),
                     .inactive_split = inactive_split.ToArray(),
                     .allocated_bytes = allocated_bytes.ToArray(),
                     .reserved_bytes = reserved_bytes.ToArray(),
                     .active_bytes = active_bytes.ToArray(),
                     .inactive_split_bytes = inactive_split_bytes.ToArray(),
                     .requested_bytes = requested_bytes.ToArray(),
                     .oversize_allocations = oversize_allocations,
                     .oversize_segments = oversize_segments,
                     .num_alloc_retries = num_alloc_retries,
                     .num_ooms = num_ooms,
                     .num_sync_all_streams = num_sync_all_streams,
                     .num_device_alloc = num_device_alloc,
                     .num_device_free = num_device_free,
                     .num_pages_mapped = num_pages_mapped,
                     .num_pages_unmapped = num_pages_unmapped,
                     .num_stitched_blocks = num_stitched_blocks,
                     .num_planned_allocs = num_planned_allocs,
                     .reserved_bytes_at_peak_allocated = reserved_bytes_at_peak_allocated};
}

}  // namespace headroom::internal
