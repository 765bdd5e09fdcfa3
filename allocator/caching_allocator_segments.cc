// Getting memory from the device and giving it back: segment growth,
// release of cached segments, garbage collection and the out-of-memory path
// (Note [Out of memory] in caching_allocator.h).
#include <algorithm>

#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {

absl::StatusOr<CachingAllocator::Block*> CachingAllocator::GrowPool(PoolKind kind, StreamHandle stream,
                                                                    uint64_t rounded) {
  if (options_.expandable_segments) return GrowExpandable(kind, stream, rounded);
  return MallocSegment(kind, stream, rounded);
}

absl::StatusOr<CachingAllocator::Block*> CachingAllocator::MallocSegment(PoolKind kind, StreamHandle stream,
                                                                         uint64_t rounded) {
  const uint64_t size = SegmentSizeFor(rounded);
  const uint64_t reserved = static_cast<uint64_t>(stats_.reserved_bytes.current());
  const uint64_t allowed = AllowedBytesLocked();
  if (size > allowed || reserved > allowed - size) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("a %s segment would exceed the limit of %s", FormatBytes(size), FormatBytes(allowed)));
  }
  HEADROOM_ASSIGN_OR_RETURN(DeviceAddress address, backend_->Malloc(size));
  ++stats_.num_device_alloc;
  Segment* segment = AddSegment(address, size, kind, stream);
  stats_.reserved_bytes.Increase(StatOf(kind), static_cast<int64_t>(size));
  if (size >= options_.max_split_size) stats_.oversize_segments.Increase(1);
  Record(TraceAction::kSegmentAlloc, address, size, stream);
  return segment->first;
}

CachingAllocator::Segment* CachingAllocator::AddSegment(DeviceAddress address, uint64_t size, PoolKind kind,
                                                        StreamHandle stream) {
  auto* segment = new Segment();
  segment->address = address;
  segment->size = size;
  segment->stream = stream;
  segment->pool = kind;
  segment->shard = &ShardOf(stream);
  Block* block = NewBlock(stream);
  block->address = address;
  block->size = size;
  block->stream = stream;
  block->pool = kind;
  block->segment = segment;
  segment->first = block;
  segments_[address] = segment;
  stats_.segment.Increase(StatOf(kind), 1);
  return segment;
}

// The segment's blocks are all free: usually one coalesced block, several
// when cross-stream reuse left neighbours of different streams. Free()
// synchronizes the device (as cudaFree does), so their streams need no wait.
absl::Status CachingAllocator::ReleaseSegment(Segment* segment) {
  for (Block* b = segment->first; b != nullptr; b = b->next) PoolErase(b);
  if (absl::Status status = backend_->Free(segment->address); !status.ok()) {
    for (Block* b = segment->first; b != nullptr; b = b->next) PoolInsert(b);
    return status;
  }
  ++stats_.num_device_free;
  stats_.segment.Decrease(StatOf(segment->pool), 1);
  stats_.reserved_bytes.Decrease(StatOf(segment->pool), static_cast<int64_t>(segment->size));
  if (segment->size >= options_.max_split_size) stats_.oversize_segments.Decrease(1);
  Record(TraceAction::kSegmentFree, segment->address, segment->size, segment->stream);
  segments_.erase(segment->address);
  for (Block* b = segment->first; b != nullptr;) {
    Block* next = b->next;
    DeleteBlock(b);
    b = next;
  }
  delete segment;
  return absl::OkStatus();
}

namespace {

// True for the first block of a plain segment whose blocks are all cached, so
// that each releasable segment is found once while scanning a pool.
bool IsWholeCachedSegment(const internal::Block* block) {
  if (block->segment->expandable || block->prev != nullptr) return false;
  for (const internal::Block* b = block; b != nullptr; b = b->next) {
    if (!b->is_free()) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<bool> CachingAllocator::ReleaseAvailableCache(PoolKind kind, uint64_t bytes) {
  std::vector<Block*> whole;
  ForEachCached(kind, [&](Block* block) {
    if (IsWholeCachedSegment(block)) whole.push_back(block);
  });
  std::sort(whole.begin(), whole.end(),
            [](const Block* a, const Block* b) { return a->segment->size < b->segment->size; });
  // One segment large enough is the least cache thrown away.
  auto enough = std::lower_bound(whole.begin(), whole.end(), bytes,
                                 [](const Block* b, uint64_t n) { return b->segment->size < n; });
  if (enough != whole.end()) {
    HEADROOM_RETURN_IF_ERROR(ReleaseSegment((*enough)->segment));
    return true;
  }
  uint64_t released = 0;
  for (auto it = whole.rbegin(); it != whole.rend() && released < bytes; ++it) {
    released += (*it)->segment->size;
    HEADROOM_RETURN_IF_ERROR(ReleaseSegment((*it)->segment));
  }
  if (released < bytes) {
    for (auto& [key, segment] : expandable_) {
      if (key.second != kind) continue;
      HEADROOM_ASSIGN_OR_RETURN(uint64_t unmapped, TrimExpandable(segment));
      released += unmapped;
      if (released >= bytes) break;
    }
  }
  return released >= bytes;
}

absl::Status CachingAllocator::ReleaseAllCache() {
  if (!unreleased_pages_.empty()) HEADROOM_RETURN_IF_ERROR(RetryUnreleasedPages());
  if (!pending_frees_.empty()) HEADROOM_RETURN_IF_ERROR(WaitForPendingFrees());
  for (PoolKind kind : {PoolKind::kSmall, PoolKind::kLarge}) {
    std::vector<Block*> whole;
    ForEachCached(kind, [&](Block* block) {
      if (IsWholeCachedSegment(block)) whole.push_back(block);
    });
    for (Block* block : whole) HEADROOM_RETURN_IF_ERROR(ReleaseSegment(block->segment));
  }
  for (auto& [key, segment] : expandable_) {
    HEADROOM_ASSIGN_OR_RETURN(uint64_t unmapped, TrimExpandable(segment));
    (void)unmapped;
  }
  return ReleaseUnusedPlannedPages();  // Note [Following a layout plan]
}

absl::Status CachingAllocator::EmptyCache() {
  ExclusiveLock lock(this);
  InvariantCheckOnExit check(this, "EmptyCache");  // Note [Expensive checks]
  HEADROOM_RETURN_IF_ERROR(ReleaseAllCache());
  // Reservations with nothing mapped go back too.
  std::vector<std::pair<StreamHandle, PoolKind>> empty;
  for (auto& [key, segment] : expandable_) {
    if (segment->mapped_bytes == 0) empty.push_back(key);
  }
  for (const auto& key : empty) {
    Segment* segment = expandable_[key];
    HEADROOM_RETURN_IF_ERROR(backend_->ReleaseAddressRange(segment->address, segment->size));
    stats_.segment.Decrease(StatOf(segment->pool), 1);
    segments_.erase(segment->address);
    expandable_.erase(key);
    DeleteBlock(segment->first);
    delete segment;
  }
  // Note [Following a layout plan]: a departed plan's range too, once nothing lives in it.
  if (const Segment* range = planned_.segment.get(); range != nullptr && !following_plan_.load() &&
                                                      planned_.live.empty() && range->mapped_bytes == 0) {
    HEADROOM_RETURN_IF_ERROR(backend_->ReleaseAddressRange(range->address, range->size));
    stats_.segment.Decrease(StatOf(PoolKind::kLarge), 1);
    planned_.segment.reset();
    planned_.users.clear();
  }
  return absl::OkStatus();
}

// Frees the cached segments (and expandable pages) that waited longest
// unused, until reserved memory is back under the threshold. Age is counted in
// pool misses, not time, so that a busy and an idle process age alike.
absl::Status CachingAllocator::GarbageCollect() {
  const auto target = static_cast<uint64_t>(options_.garbage_collection_threshold *
                                            static_cast<double>(AllowedBytesLocked()));
  auto reserved = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<uint64_t>(stats_.reserved_bytes.current());
  };
  if (reserved() <= target) return absl::OkStatus();
  std::vector<Block*> candidates;
  ForEachCached(PoolKind::kLarge, [&](Block* block) {
    if (IsWholeCachedSegment(block) || block->segment->expandable) candidates.push_back(block);
  });
  std::sort(candidates.begin(), candidates.end(), [](const Block* a, const Block* b) {
    return a->cached_at < b->cached_at || (a->cached_at == b->cached_at && a->address < b->address);
  });
  for (Block* block : candidates) {
    if (reserved() <= target) break;
    if (block->segment->expandable) {
      HEADROOM_ASSIGN_OR_RETURN(uint64_t unmapped, UnmapFreePages(block, /*synchronized=*/false));
      (void)unmapped;
    } else {
      HEADROOM_RETURN_IF_ERROR(ReleaseSegment(block->segment));
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
  const uint64_t allowed = AllowedBytesLocked();
  std::string limit;
  if (allowed < total_bytes_) {
    limit = absl::StrFormat(", of which this allocator may reserve %s (memory_fraction %g%s)", FormatBytes(allowed),
                            memory_fraction_,
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
