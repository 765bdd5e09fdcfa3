#include "allocator/pool_stats.h"

namespace headroom::internal {

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
                     .reserved_bytes_at_peak_allocated = reserved_bytes_at_peak_allocated};
}

}  // namespace headroom::internal
