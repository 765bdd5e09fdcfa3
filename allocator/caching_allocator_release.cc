// Getting memory from the memory sources and giving it back: growth,
// release of cached segments and pages, garbage collection and the
// out-of-memory path (Note [Out of memory] in caching_allocator.h), and the
// pages the device would not release (Note [Unreleased pages]).
#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {

absl::StatusOr<CachingAllocator::Block*> CachingAllocator::GrowPool(PoolKind kind, StreamHandle stream,
                                                                    uint64_t rounded) {
  if (options_.expandable_segments) return expandable_.Grow(kind, stream, rounded);
  return classic_.Allocate(kind, stream, rounded);
}

absl::StatusOr<bool> CachingAllocator::ReleaseAvailableCache(PoolKind kind, uint64_t bytes) {
  std::vector<Block*> whole;
  ForEachCached(kind, [&](Block* block) {
    if (internal::ClassicSegments::IsWholeCachedSegment(block)) whole.push_back(block);
  });
  std::sort(whole.begin(), whole.end(),
            [](const Block* a, const Block* b) { return a->segment->size < b->segment->size; });
  // One segment large enough is the least cache thrown away.
  auto enough = std::lower_bound(whole.begin(), whole.end(), bytes,
                                 [](const Block* b, uint64_t n) { return b->segment->size < n; });
  if (enough != whole.end()) {
    HEADROOM_RETURN_IF_ERROR(classic_.Release((*enough)->segment));
    return true;
  }
  uint64_t released = 0;
  for (auto it = whole.rbegin(); it != whole.rend() && released < bytes; ++it) {
    released += (*it)->segment->size;
    HEADROOM_RETURN_IF_ERROR(classic_.Release((*it)->segment));
  }
  if (released < bytes) {
    HEADROOM_ASSIGN_OR_RETURN(uint64_t unmapped, expandable_.Trim(kind, bytes - released));
    released += unmapped;
  }
  return released >= bytes;
}

absl::Status CachingAllocator::ReleaseAllCache() {
  if (!unreleased_pages_.empty()) HEADROOM_RETURN_IF_ERROR(RetryUnreleasedPages());
  if (!pending_frees_.empty()) HEADROOM_RETURN_IF_ERROR(WaitForPendingFrees());
  for (PoolKind kind : {PoolKind::kSmall, PoolKind::kLarge}) {
    std::vector<Block*> whole;
    ForEachCached(kind, [&](Block* block) {
      if (internal::ClassicSegments::IsWholeCachedSegment(block)) whole.push_back(block);
    });
    for (Block* block : whole) HEADROOM_RETURN_IF_ERROR(classic_.Release(block->segment));
  }
  HEADROOM_RETURN_IF_ERROR(expandable_.TrimAll());
  return planned_.ReleaseUnusedPages();  // Note [Following a layout plan]
}

absl::Status CachingAllocator::ReleasePage(PhysicalHandle handle, PoolKind pool) {
  absl::Status status = backend_->ReleasePhysical(handle);
  if (!status.ok()) {
    unreleased_pages_.push_back({handle, pool});
    return status;
  }
  ++stats_.num_device_free;
  stats_.reserved_bytes.Decrease(StatOf(pool), static_cast<int64_t>(granularity_));
  return absl::OkStatus();
}

absl::Status CachingAllocator::RetryUnreleasedPages() {
  std::vector<UnreleasedPage> pages;
  pages.swap(unreleased_pages_);
  absl::Status first_error;
  for (const UnreleasedPage& page : pages) {
    absl::Status status = ReleasePage(page.handle, page.pool);
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  return first_error;
}

absl::Status CachingAllocator::EmptyCache() {
  ExclusiveLock lock(this);
  InvariantCheckOnExit check(this, "EmptyCache");  // Note [Expensive checks]
  HEADROOM_RETURN_IF_ERROR(ReleaseAllCache());
  // Reservations with nothing mapped go back too.
  HEADROOM_RETURN_IF_ERROR(expandable_.ReleaseEmptyReservations());
  // Note [Following a layout plan]: a departed plan's range too, once nothing lives in it.
  if (!following_plan_.load()) HEADROOM_RETURN_IF_ERROR(planned_.ReleaseIdleRange());
  return absl::OkStatus();
}

// Frees the cached segments (and expandable pages) that waited longest
// unused, until reserved memory is back under the threshold. Age is counted in
// pool misses, not time, so that a busy and an idle process age alike.
absl::Status CachingAllocator::GarbageCollect() {
  const auto target = static_cast<uint64_t>(options_.garbage_collection_threshold *
                                            static_cast<double>(limits_.AllowedBytes()));
  auto reserved = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<uint64_t>(stats_.reserved_bytes.current());
  };
  if (reserved() <= target) return absl::OkStatus();
  std::vector<Block*> candidates;
  ForEachCached(PoolKind::kLarge, [&](Block* block) {
    if (internal::ClassicSegments::IsWholeCachedSegment(block) || block->segment->expandable) candidates.push_back(block);
  });
  std::sort(candidates.begin(), candidates.end(), [](const Block* a, const Block* b) {
    return a->cached_at < b->cached_at || (a->cached_at == b->cached_at && a->address < b->address);
  });
  for (Block* block : candidates) {
    if (reserved() <= target) break;
    if (block->segment->expandable) {
      HEADROOM_ASSIGN_OR_RETURN(uint64_t unmapped, expandable_.UnmapFreePages(block, /*synchronized=*/false));
      (void)unmapped;
    } else {
      HEADROOM_RETURN_IF_ERROR(classic_.Release(block->segment));
    }
  }
  return absl::OkStatus();
}

absl::Status CachingAllocator::OutOfMemory(uint64_t size, uint64_t rounded, StreamHandle stream,
                                           const absl::Status& cause) {
  ++stats_.num_ooms;
  absl::StatusOr<MemoryInfo> info = backend_->GetMemoryInfo();
  const uint64_t device_free = info.ok() ? info->free_bytes : 0;
  if (history_.enabled()) {
    internal::SpinLockHolder history_lock(&history_mu_);
    history_.Add({.action = TraceAction::kOom,
                  .address = 0,
                  .size = rounded,
                  .stream = stream,
                  .time_ns = backend_->NowNanoseconds(),
                  .device_free = device_free});
  }
  const auto reserved = static_cast<uint64_t>(stats_.reserved_bytes.current());
  const auto allocated = static_cast<uint64_t>(stats_.allocated_bytes.current());
  const uint64_t unallocated = reserved - allocated;
  const uint64_t largest = LargestCachedSize();
  const uint64_t allowed = limits_.AllowedBytes();
  std::string limit;
  if (allowed < total_bytes_) {
    limit = absl::StrFormat(", of which this allocator may reserve %s (memory_fraction %g%s)", FormatBytes(allowed),
                            limits_.memory_fraction(),
                            options_.hard_limit_bytes != 0
                                ? absl::StrFormat(", hard limit %s", FormatBytes(options_.hard_limit_bytes))
                                : std::string());
  }
  std::string hint;
  if (unallocated >= rounded || (reserved > 0 && unallocated * 10 >= reserved)) {
    hint = options_.expandable_segments
               ? "reserved-but-unallocated memory is large: try garbage_collection_threshold or empty the cache"
               : "reserved-but-unallocated memory is large: set expandable_segments:True (or max_split_size_mb) "
                 "in HEADROOM_ALLOC_CONF to avoid fragmentation";
  } else if (allowed < total_bytes_) {
    hint = "raise memory_fraction / the hard limit, or allocate less";
  } else {
    hint = "the live allocations do not fit: allocate less (smaller batch, activation checkpointing, offload)";
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory: tried to allocate %s (%d bytes, %s after rounding) on stream %d. Device '%s' capacity %s%s; "
      "%s free on the device; this allocator has %s allocated and %s reserved but unallocated (largest cached "
      "block %s). Hint: %s. (device said: %s)",
      FormatBytes(size), size, FormatBytes(rounded), stream.value, backend_->properties().name,
      FormatBytes(total_bytes_), limit, FormatBytes(device_free), FormatBytes(allocated), FormatBytes(unallocated),
      FormatBytes(largest), hint, std::string(cause.message())));
}

}  // namespace headroom
