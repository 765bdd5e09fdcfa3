// The allocator's invariant checks (block.h lists the invariants), one
// validator per structure:
//  - each memory source's Validate (sources/): its own structure (segments
//    filed where they belong, page tables, stitched and planned blocks),
//    adding its blocks to the recount where the tiling below does not;
//  - ValidateSegmentTiling: each classic or expandable segment's blocks tile
//    it, with consistent links, pools, states and coalescing; it also
//    recounts the statistics;
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
  // Each source's own structure, then the blocks of the segments they file.
  HEADROOM_RETURN_IF_ERROR(classic_.Validate());
  HEADROOM_RETURN_IF_ERROR(expandable_.Validate());
  for (const Segment* segment : SegmentsByAddress()) HEADROOM_RETURN_IF_ERROR(ValidateSegmentTiling(*segment, recount));
  HEADROOM_RETURN_IF_ERROR(stitched_.Validate(recount));
  // Note [Following a layout plan]: requests go to the plan until it departs.
  if (following_plan_.load() != (options_.layout_plan != nullptr && planned_.departure().empty())) {
    return HEADROOM_INVARIANT_ERROR("layout plan: followed is %d, departure '%s'", following_plan_.load(),
                                    planned_.departure());
  }
  HEADROOM_RETURN_IF_ERROR(planned_.Validate(recount));
  HEADROOM_RETURN_IF_ERROR(ValidatePools(recount.free_blocks));
  if (recount.pending_events != pending_frees_.size()) {
    return HEADROOM_INVARIANT_ERROR("%d pending events recorded on blocks, %d in the queue", recount.pending_events,
                                    pending_frees_.size());
  }
  HEADROOM_RETURN_IF_ERROR(ValidatePointerTables(recount.allocation[kAllPools].current));
  return ValidateStatistics(recount);
}

absl::Status CachingAllocator::ValidateSegmentTiling(const Segment& segment, Recount& recount) const {
  const size_t pool_stat = StatOf(segment.pool);
  recount.CountSegment(pool_stat, segment.expandable ? segment.mapped_bytes : segment.size);
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
      // Counted as the stitched block that holds it (StitchedRanges::Validate).
      if (!b->allocated || b->stream_uses.size() > 0 || b->pending_events > 0) {
        return HEADROOM_INVARIANT_ERROR("block 0x%x: a stitched piece that is not simply allocated", b->address);
      }
    } else {
      recount.CountActive(*b, pool_stat);
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
  // The memory limit counts what the statistics count (LimitingBackend).
  if (limits_.alive_bytes() != static_cast<uint64_t>(stats_.reserved_bytes.current())) {
    return HEADROOM_INVARIANT_ERROR("the memory limit counts %d bytes alive, reserved_bytes %d", limits_.alive_bytes(),
                                    stats_.reserved_bytes.current());
  }
  if (stats_.allocated_bytes.current() > stats_.active_bytes.current() ||
      stats_.active_bytes.current() > stats_.reserved_bytes.current()) {
    return HEADROOM_INVARIANT_ERROR("allocated <= active <= reserved does not hold");
  }
  return absl::OkStatus();
}

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
