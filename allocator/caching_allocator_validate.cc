// The allocator's invariant checks (block.h lists the invariants), one
// validator per structure:
//  - ValidateSegmentTiling: each segment's blocks tile it, with consistent
//    links, pools, states and coalescing; it also recounts the statistics;
//  - ValidateExpandablePages: an expandable segment's page table against its
//    blocks (Note [Expandable page table]);
//  - ValidatePools: each shard's BlockPools' bins, bitmap and trees
//    (BlockPool::Validate), and the pools against the free blocks;
//  - ValidatePointerTables: the shards' address tables against the allocated
//    blocks (Note [Stream shards]);
//  - ValidateStatistics: the counters against the recount.
// Validate() runs them all; with HEADROOM_EXPENSIVE_CHECKS every public
// operation ends by running them (Note [Expensive checks]).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "common/status_macros.h"

namespace headroom {

// A macro, not a lambda, so that the format string stays a checked constant.
#define HEADROOM_INVARIANT_ERROR(...) absl::InternalError(absl::StrFormat(__VA_ARGS__))

// What the statistics should say, recomputed from the blocks.
struct CachingAllocator::Recount {
  StatArray allocation{}, allocated_bytes{}, requested{}, active{}, active_bytes{}, reserved{}, segments{},
      inactive_split{}, inactive_split_bytes{};
  size_t free_blocks = 0;
  size_t pending_events = 0;  // summed over blocks
  size_t stitched_parts = 0;  // blocks flagged Block::stitched_part
};

absl::Status CachingAllocator::Validate() const {
  ExclusiveLock lock(this);
  return ValidateLocked();
}

absl::Status CachingAllocator::ValidateLocked() const {
  Recount recount;
  for (const UnreleasedPage& page : unreleased_pages_) {
    for (size_t i : {size_t{kAllPools}, size_t{StatOf(page.pool)}}) {
      recount.reserved[i].current += static_cast<int64_t>(granularity_);
    }
  }
  for (const auto& [address, segment] : segments_) {
    if (segment->address != address) {
      return HEADROOM_INVARIANT_ERROR("segment 0x%x filed under 0x%x", segment->address, address);
    }
    HEADROOM_RETURN_IF_ERROR(ValidateSegmentTiling(*segment, recount));
    if (segment->expandable) HEADROOM_RETURN_IF_ERROR(ValidateExpandablePages(*segment));
  }
  HEADROOM_RETURN_IF_ERROR(ValidateStitched(recount));
  HEADROOM_RETURN_IF_ERROR(ValidatePlanned(recount));
  HEADROOM_RETURN_IF_ERROR(ValidatePools(recount.free_blocks));
  if (recount.pending_events != pending_frees_.size()) {
    return HEADROOM_INVARIANT_ERROR("%d pending events recorded on blocks, %d in the queue", recount.pending_events,
                                    pending_frees_.size());
  }
  HEADROOM_RETURN_IF_ERROR(ValidatePointerTables(recount.allocation[kAllPools].current));
  return ValidateStatistics(recount);
}

void CachingAllocator::CountActive(const Block& b, size_t pool_stat, Recount& recount) {
  if (b.allocated) {
    for (size_t i : {size_t{kAllPools}, pool_stat}) {
      recount.allocation[i].current += 1;
      recount.allocated_bytes[i].current += static_cast<int64_t>(b.size);
      recount.requested[i].current += static_cast<int64_t>(b.requested_size);
    }
  }
  if (b.is_active()) {
    for (size_t i : {size_t{kAllPools}, pool_stat}) {
      recount.active[i].current += 1;
      recount.active_bytes[i].current += static_cast<int64_t>(b.size);
    }
  }
  recount.pending_events += static_cast<size_t>(b.pending_events);
}

// Note [Stitched blocks]: each stitched block is counted, its pieces are
// allocated in their segment, sum to its size and lie where its range maps.
absl::Status CachingAllocator::ValidateStitched(Recount& recount) const {
  size_t parts = 0;
  for (const auto& [address, stitched] : stitched_) {
    const Block* block = stitched.segment->first;
    if (block == nullptr || block->address != address || block->segment != stitched.segment.get() ||
        block->prev != nullptr || block->next != nullptr || !stitched.segment->stitched) {
      return HEADROOM_INVARIANT_ERROR("stitched block 0x%x: not the one block of its segment", address);
    }
    if (!block->is_active()) {
      return HEADROOM_INVARIANT_ERROR("stitched block 0x%x: neither allocated nor pending", address);
    }
    uint64_t bytes = 0;
    for (const Block* part : stitched.parts) {
      if (!part->stitched_part || part->segment->stitched) {
        return HEADROOM_INVARIANT_ERROR("stitched block 0x%x: piece 0x%x is not marked as one", address, part->address);
      }
      bytes += part->size;
    }
    if (bytes != block->size) {
      return HEADROOM_INVARIANT_ERROR("stitched block 0x%x: pieces of %d bytes for a block of %d", address, bytes,
                                      block->size);
    }
    if (address < stitched.range || address + block->size > stitched.range + stitched.range_bytes) {
      return HEADROOM_INVARIANT_ERROR("stitched block 0x%x: outside its mapped range", address);
    }
    parts += stitched.parts.size();
    CountActive(*block, StatOf(block->pool), recount);
  }
  if (parts != recount.stitched_parts) {
    return HEADROOM_INVARIANT_ERROR("%d stitched pieces in segments, %d held by stitched blocks",
                                    recount.stitched_parts, parts);
  }
  return absl::OkStatus();
}

// Note [Following a layout plan]: the live planned blocks lie apart in the
// plan's range, in mapped pages, which they use as `users` says.
absl::Status CachingAllocator::ValidatePlanned(Recount& recount) const {
  if (following_plan_.load() != (options_.layout_plan != nullptr && planned_.departure.empty())) {
    return HEADROOM_INVARIANT_ERROR("layout plan: followed is %d, departure '%s'", following_plan_.load(),
                                    planned_.departure);
  }
  const Segment* range = planned_.segment.get();
  if (range == nullptr) {
    if (!planned_.live.empty()) return HEADROOM_INVARIANT_ERROR("layout plan: live blocks but no range");
    return absl::OkStatus();
  }
  for (size_t i : {size_t{kAllPools}, size_t{kLargePoolStat}}) {
    recount.segments[i].current += 1;
    recount.reserved[i].current += static_cast<int64_t>(range->mapped_bytes);
  }
  // Note [Expandable page table]: a mapped page was touched, so the page table ends within the users'.
  if (!range->planned || range->pages.size() > planned_.users.size() ||
      planned_.users.size() > range->size / granularity_) {
    return HEADROOM_INVARIANT_ERROR("layout plan: range 0x%x of %d bytes, %d pages, %d page users", range->address,
                                    range->size, range->pages.size(), planned_.users.size());
  }
  std::vector<uint32_t> users(planned_.users.size(), 0);
  DeviceAddress end = range->address;
  for (const auto& [address, b] : planned_.live) {
    if (b->address != address || b->segment != range || b->prev != nullptr || b->next != nullptr ||
        b->pool != PoolKind::kLarge || b->stream != range->stream) {
      return HEADROOM_INVARIANT_ERROR("planned block 0x%x: not a block of the plan's range filed under its address",
                                      address);
    }
    if (!b->is_active()) return HEADROOM_INVARIANT_ERROR("planned block 0x%x: neither allocated nor pending", address);
    if (address < end || b->size == 0 || b->size > range->address + range->size - address) {
      return HEADROOM_INVARIANT_ERROR("planned block 0x%x: overlaps the one below it or leaves the range", address);
    }
    end = address + b->size;
    const auto [first, last] = PlannedPages(b->address, b->size);
    for (uint64_t page = first; page <= last; ++page) {
      if (range->PageAt(page).value == 0) {
        return HEADROOM_INVARIANT_ERROR("planned block 0x%x: page %d is not mapped", address, page);
      }
      ++users[page];
    }
    CountActive(*b, kLargePoolStat, recount);
  }
  if (users != planned_.users) return HEADROOM_INVARIANT_ERROR("layout plan: page users differ from the live blocks");
  uint64_t mapped = 0;
  for (PhysicalHandle page : range->pages) mapped += page.value != 0 ? 1 : 0;
  if (mapped * granularity_ != range->mapped_bytes) {
    return HEADROOM_INVARIANT_ERROR("layout plan: %d pages mapped but mapped_bytes %d", mapped, range->mapped_bytes);
  }
  return absl::OkStatus();
}

absl::Status CachingAllocator::ValidateSegmentTiling(const Segment& segment, Recount& recount) const {
  const size_t pool_stat = StatOf(segment.pool);
  for (size_t i : {size_t{kAllPools}, pool_stat}) {
    recount.segments[i].current += 1;
    recount.reserved[i].current += static_cast<int64_t>(segment.expandable ? segment.mapped_bytes : segment.size);
  }
  uint64_t expected = segment.address;
  const Block* prev = nullptr;
  size_t unmapped_blocks = 0;
  for (const Block* b = segment.first; b != nullptr; b = b->next) {
    if (b->prev != prev) return HEADROOM_INVARIANT_ERROR("block 0x%x: broken prev link", b->address);
    if (b->segment != &segment) return HEADROOM_INVARIANT_ERROR("block 0x%x: wrong segment", b->address);
    if (b->address != expected) {
      return HEADROOM_INVARIANT_ERROR("block 0x%x: gap or overlap, expected 0x%x", b->address, expected);
    }
    if (b->size == 0 || b->size % kMinBlockSize != 0 || b->address % kMinBlockSize != 0) {
      return HEADROOM_INVARIANT_ERROR("block 0x%x: size %d or address not a multiple of 512", b->address, b->size);
    }
    if (b->pool != segment.pool) return HEADROOM_INVARIANT_ERROR("block 0x%x: pool differs from its segment", b->address);
    if (b->allocated && b->pending_events > 0) {
      return HEADROOM_INVARIANT_ERROR("block 0x%x: allocated and pending", b->address);
    }
    if (!b->mapped) {
      if (!segment.expandable) return HEADROOM_INVARIANT_ERROR("block 0x%x: unmapped in a plain segment", b->address);
      if (b->is_active()) return HEADROOM_INVARIANT_ERROR("block 0x%x: unmapped but in use", b->address);
      if ((b->address - segment.address) % granularity_ != 0 || b->size % granularity_ != 0) {
        return HEADROOM_INVARIANT_ERROR("unmapped block 0x%x: not page aligned", b->address);
      }
      if (!segment.unmapped.contains(const_cast<Block*>(b))) {
        return HEADROOM_INVARIANT_ERROR("unmapped block 0x%x missing from its segment's set", b->address);
      }
      if (prev != nullptr && !prev->mapped) {
        return HEADROOM_INVARIANT_ERROR("adjacent unmapped blocks at 0x%x", b->address);
      }
      ++unmapped_blocks;
    }
    const bool in_pool = PoolOf(b->pool, b->stream).Contains(const_cast<Block*>(b));
    if (b->is_free() != in_pool) {
      return HEADROOM_INVARIANT_ERROR("block 0x%x: free=%d but in pool=%d", b->address, b->is_free(), in_pool);
    }
    if (b->is_free()) {
      ++recount.free_blocks;
      if (prev != nullptr && prev->is_free() && prev->stream == b->stream) {
        return HEADROOM_INVARIANT_ERROR("free blocks 0x%x and 0x%x were not coalesced", prev->address, b->address);
      }
      if (b->counted_inactive_split != b->is_split()) {
        return HEADROOM_INVARIANT_ERROR("block 0x%x: inactive_split accounting is stale", b->address);
      }
      if (b->counted_inactive_split) {
        for (size_t i : {size_t{kAllPools}, pool_stat}) {
          recount.inactive_split[i].current += 1;
          recount.inactive_split_bytes[i].current += static_cast<int64_t>(b->size);
        }
      }
    }
    if (b->stitched_part) {
      ++recount.stitched_parts;
      // Counted as the stitched block that holds it (ValidateStitched).
      if (!b->allocated || b->stream_uses.size() > 0 || b->pending_events > 0) {
        return HEADROOM_INVARIANT_ERROR("block 0x%x: a stitched piece that is not simply allocated", b->address);
      }
    } else {
      CountActive(*b, pool_stat, recount);
    }
    expected += b->size;
    prev = b;
  }
  if (expected != segment.address + segment.size) {
    return HEADROOM_INVARIANT_ERROR("segment 0x%x: blocks cover %d of %d bytes", segment.address,
                                    expected - segment.address, segment.size);
  }
  if (segment.expandable && unmapped_blocks != segment.unmapped.size()) {
    return HEADROOM_INVARIANT_ERROR("segment 0x%x: unmapped set holds stale blocks", segment.address);
  }
  return absl::OkStatus();
}

// Note [Expandable page table]: pages beyond the table are unmapped, so every
// loop here stops at the table's end, however large the reservation.
absl::Status CachingAllocator::ValidateExpandablePages(const Segment& segment) const {
  const uint64_t table_pages = segment.pages.size();
  if (table_pages > 0 && segment.pages.back().value == 0) {
    return HEADROOM_INVARIANT_ERROR("segment 0x%x: page table ends in an unmapped page", segment.address);
  }
  if (table_pages * granularity_ > segment.size) {
    return HEADROOM_INVARIANT_ERROR("segment 0x%x: page table of %d pages exceeds the reservation", segment.address,
                                    table_pages);
  }
  for (const Block* b = segment.first; b != nullptr; b = b->next) {
    const uint64_t first = (b->address - segment.address) / granularity_;
    const uint64_t last = (b->address + b->size - 1 - segment.address) / granularity_;
    if (b->mapped && last >= table_pages) {
      return HEADROOM_INVARIANT_ERROR("mapped block 0x%x extends past the page table", b->address);
    }
    for (uint64_t p = first; p <= last && p < table_pages; ++p) {
      const bool page_mapped = segment.pages[p].value != 0;
      if (b->mapped && !page_mapped) {
        return HEADROOM_INVARIANT_ERROR("mapped block 0x%x lies on an unmapped page", b->address);
      }
      if (!b->mapped && page_mapped) {
        return HEADROOM_INVARIANT_ERROR("unmapped block 0x%x lies on a mapped page", b->address);
      }
    }
  }
  uint64_t mapped_pages = 0;
  for (PhysicalHandle page : segment.pages) mapped_pages += page.value != 0 ? 1 : 0;
  if (mapped_pages * granularity_ != segment.mapped_bytes) {
    return HEADROOM_INVARIANT_ERROR("segment 0x%x: %d pages mapped but mapped_bytes %d", segment.address, mapped_pages,
                                    segment.mapped_bytes);
  }
  return absl::OkStatus();
}

absl::Status CachingAllocator::ValidatePools(size_t free_blocks) const {
  size_t cached = 0;
  for (const StreamShard* shard : Shards()) {
    for (PoolKind kind : {PoolKind::kSmall, PoolKind::kLarge}) {
      const BlockPool& pool = shard->Pool(kind);
      const char* name = kind == PoolKind::kSmall ? "small" : "large";
      if (absl::Status status = pool.Validate(); !status.ok()) {
        return HEADROOM_INVARIANT_ERROR("%s pool: %s", name, std::string(status.message()));
      }
      for (StreamHandle stream : pool.Streams()) {
        if (FindShard(stream) != shard) {
          return HEADROOM_INVARIANT_ERROR("%s pool: blocks of stream %d cached in another stream's shard", name,
                                          stream.value);
        }
      }
      cached += pool.size();
    }
  }
  if (free_blocks != cached) {
    return HEADROOM_INVARIANT_ERROR("pools hold %d blocks but %d blocks are free", cached, free_blocks);
  }
  return absl::OkStatus();
}

absl::Status CachingAllocator::ValidatePointerTables(int64_t allocated_blocks) const {
  size_t entries = 0;
  for (const StreamShard* shard : Shards()) {
    const DeviceAddress bad = shard->pointers.FirstBadEntry([&](DeviceAddress address, const Block* block) {
      return block != nullptr && block->address == address && block->allocated && FindShard(block->stream) == shard;
    });
    if (bad == ~DeviceAddress{0}) return HEADROOM_INVARIANT_ERROR("a shard's address table: its count is off");
    if (bad != 0) {
      return HEADROOM_INVARIANT_ERROR(
          "address table entry 0x%x: unreachable, not an allocated block at that address, or in another stream's "
          "shard", bad);
    }
    entries += shard->pointers.size();
  }
  if (entries != static_cast<size_t>(allocated_blocks)) {
    return HEADROOM_INVARIANT_ERROR("address tables hold %d entries for %d allocated blocks", entries,
                                    allocated_blocks);
  }
  return absl::OkStatus();
}

absl::Status CachingAllocator::ValidateStatistics(const Recount& recount) const {
  struct Check {
    const char* name;
    const StatArray& expected;
    StatArray actual;
  };
  for (const Check& check : {Check{"allocation", recount.allocation, stats_.allocation.ToArray()},
                             Check{"allocated_bytes", recount.allocated_bytes, stats_.allocated_bytes.ToArray()},
                             Check{"requested_bytes", recount.requested, stats_.requested_bytes.ToArray()},
                             Check{"active", recount.active, stats_.active.ToArray()},
                             Check{"active_bytes", recount.active_bytes, stats_.active_bytes.ToArray()},
                             Check{"reserved_bytes", recount.reserved, stats_.reserved_bytes.ToArray()},
                             Check{"segment", recount.segments, stats_.segment.ToArray()},
                             Check{"inactive_split", recount.inactive_split, stats_.inactive_split.ToArray()},
                             Check{"inactive_split_bytes", recount.inactive_split_bytes,
                                   stats_.inactive_split_bytes.ToArray()}}) {
    for (size_t i = 0; i < kStatIndexCount; ++i) {
      const Stat& s = check.actual[i];
      if (s.current != check.expected[i].current) {
        return HEADROOM_INVARIANT_ERROR("stat %s[%d]: current %d, recomputed %d", check.name, i, s.current,
                                        check.expected[i].current);
      }
      if (s.peak < s.current) {
        return HEADROOM_INVARIANT_ERROR("stat %s[%d]: peak %d below current %d", check.name, i, s.peak, s.current);
      }
    }
  }
  if (stats_.allocated_bytes.current() > stats_.active_bytes.current() ||
      stats_.active_bytes.current() > stats_.reserved_bytes.current()) {
    return HEADROOM_INVARIANT_ERROR("allocated <= active <= reserved does not hold");
  }
  return absl::OkStatus();
}

#undef HEADROOM_INVARIANT_ERROR

// Note [Expensive checks]
void CachingAllocator::CheckInvariantsAfter(const char* operation) const {
  if constexpr (kExpensiveChecks) {
    const absl::Status status = ValidateLocked();
    if (!status.ok()) {
      std::fprintf(stderr, "headroom: allocator invariant broken after %s: %s\n", operation,
                   std::string(status.message()).c_str());
      std::abort();
    }
  } else {
    (void)operation;
  }
}

}  // namespace headroom
