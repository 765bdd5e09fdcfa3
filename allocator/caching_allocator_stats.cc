// Statistics, snapshots and the settings a caller may change at run time.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"

namespace headroom {

// --- Statistics ------------------------------------------------------------------

void CachingAllocator::UpdatePeakTracking() {
  if (stats_.allocated_bytes.current() >= stats_.allocated_bytes.peak()) {
    stats_.reserved_bytes_at_peak_allocated = stats_.reserved_bytes.current();
    allocated_high_water_ = std::max(allocated_high_water_, stats_.allocated_bytes.current());
  }
}

void CachingAllocator::ResetPeakStats() {
  ExclusiveLock lock(this);
  InvariantCheckOnExit check(this, "ResetPeakStats");  // Note [Expensive checks]
  stats_.ResetPeaks();
}

void CachingAllocator::ResetAccumulatedStats() {
  ExclusiveLock lock(this);
  InvariantCheckOnExit check(this, "ResetAccumulatedStats");  // Note [Expensive checks]
  stats_.ResetAccumulated();
}

MemoryStats CachingAllocator::GetStats() const {
  ExclusiveLock lock(this);
  MemoryStats stats = stats_.ToMemoryStats();
  stats.max_split_size = ReportedMaxSplitSize();
  const uint64_t largest = LargestCachedSize();
  stats.largest_free_block_bytes = largest;
  stats.total_free_bytes =
      static_cast<uint64_t>(stats.reserved_bytes[kAllPools].current - stats.active_bytes[kAllPools].current);
  stats.external_fragmentation =
      stats.total_free_bytes == 0 ? 0.0
                                  : 1.0 - static_cast<double>(largest) / static_cast<double>(stats.total_free_bytes);
  const int64_t peak = stats.allocated_bytes[kAllPools].peak;
  stats.reserved_to_allocated_at_peak =
      peak == 0 ? 0.0 : static_cast<double>(stats.reserved_bytes_at_peak_allocated) / static_cast<double>(peak);
  return stats;
}

int64_t CachingAllocator::PeakReservedBytes() const {
  internal::MutexLock lock(&mu_);  // reserved bytes change under the exclusive lock only
  return stats_.reserved_bytes.peak();
}

void CachingAllocator::SetHistoryCapacity(size_t entries) {
  ExclusiveLock lock(this);
  InvariantCheckOnExit check(this, "SetHistoryCapacity");  // Note [Expensive checks]
  internal::SpinLockHolder history_lock(&history_mu_);
  history_.SetCapacity(entries);
}

absl::Status CachingAllocator::SetMemoryFraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat("memory fraction %g is not in (0, 1]", fraction));
  }
  ExclusiveLock lock(this);
  InvariantCheckOnExit check(this, "SetMemoryFraction");  // Note [Expensive checks]
  limits_.SetMemoryFraction(fraction);
  return absl::OkStatus();
}

AllocatorSnapshot CachingAllocator::TakeSnapshot() const {
  ExclusiveLock lock(this);
  AllocatorSnapshot snapshot;
  snapshot.device = backend_->properties().ordinal;
  auto add = [&snapshot](const Segment& segment) {
    SegmentSnapshot current;
    auto flush = [&] {
      if (!current.blocks.empty()) snapshot.segments.push_back(std::move(current));
      current = SegmentSnapshot();
    };
    for (const Block* b = segment.first; b != nullptr; b = b->next) {
      if (!b->mapped) {  // expandable: one snapshot segment per mapped run
        flush();
        continue;
      }
      if (current.blocks.empty()) {
        current.address = b->address;
        current.stream = segment.stream;
        current.small_pool = segment.pool == PoolKind::kSmall;
        current.expandable = segment.expandable || segment.stitched;
        current.stitched = segment.stitched;
      }
      BlockSnapshot block{.address = b->address, .size = b->size, .requested_size = b->requested_size};
      if (b->stitched_part) {
        block.state = BlockState::kStitchedPart;
      } else if (b->allocated) {
        block.state = BlockState::kActiveAllocated;
        current.allocated_size += b->size;
        current.active_size += b->size;
        current.requested_size += b->requested_size;
      } else if (b->is_active()) {
        block.state = BlockState::kActivePendingFree;
        current.active_size += b->size;
      }
      current.total_size += b->size;
      current.blocks.push_back(block);
    }
    flush();
  };
  for (const Segment* segment : SegmentsByAddress()) add(*segment);
  // Note [Stitched blocks]: each in a segment of its own, in address order.
  stitched_.ForEachSegment(add);
  planned_.AddToSnapshot(snapshot);
  snapshot.trace = history_.Entries();
  snapshot.settings = {{"max_split_size", ReportedMaxSplitSize()},
                       {"expandable_segments", options_.expandable_segments},
                       {"garbage_collection_threshold", options_.garbage_collection_threshold},
                       {"roundup_power2_divisions", options_.rounding.divisions_by_mib_interval.empty()
                                                        ? nlohmann::json(options_.rounding.power2_divisions)
                                                        : nlohmann::json(options_.rounding.divisions_by_mib_interval)},
                       {"memory_fraction", limits_.memory_fraction()},
                       {"cross_stream_reuse", options_.cross_stream_reuse},
                       {"move_free_pages", options_.move_free_pages},
                       {"move_threshold", options_.move_threshold},
                       {"move_threshold_max", options_.move_threshold_max},
                       {"unified_pool", options_.unified_pool},
                       {"reuse_layout_min_bytes", options_.reuse_layout_min_bytes},
                       {"align_growth", options_.align_growth},
                       {"stitch_pages", options_.stitch_pages}};
  return snapshot;
}

std::string CachingAllocator::PlanDeparture() const {
  ExclusiveLock lock(this);
  return planned_.departure();
}

}  // namespace headroom
