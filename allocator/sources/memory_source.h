// The caching allocator's memory sources and the one interface they share
// with it. A source is where the blocks of a request come from when no cached
// block serves it:
//   - ClassicSegments (classic_segments.h): one device Malloc per segment;
//   - ExpandableSegments (expandable_segments.h): one address reservation per
//     (stream, pool) whose pages are mapped as it grows;
//   - StitchedRanges (stitched_ranges.h): free pieces of an expandable
//     segment's pages mapped again, side by side, for a request that would
//     otherwise run out of memory;
//   - PlannedRange (planned_range.h): the address range of a layout plan.
// Each owns its state, checks its own invariants (a Validate that adds to the
// Recount below) and keeps the Notes of its policy. What the sources share
// (the free-block pools and their statistics, the spare Block objects of the
// stream shards, the history, the pages the device would not release) stays
// with the allocator, which a source reaches through SourceHost; the memory
// limit is the LimitingBackend a source calls the device through.
//
// Locking: a source is a member of CachingAllocator guarded by its mutex
// (ABSL_GUARDED_BY), so every call into a source holds the exclusive lock
// (Note [Stream shards]); the SourceHost calls it makes back run under that
// same lock.
#ifndef HEADROOM_ALLOCATOR_SOURCES_MEMORY_SOURCE_H_
#define HEADROOM_ALLOCATOR_SOURCES_MEMORY_SOURCE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "allocator/allocator_options.h"
#include "allocator/block.h"
#include "allocator/device_backend.h"
#include "allocator/history.h"
#include "allocator/limiting_backend.h"
#include "allocator/memory_stats.h"
#include "allocator/pool_stats.h"

namespace headroom::internal {

struct StreamShard;

inline StatIndex StatOf(PoolKind kind) { return kind == PoolKind::kSmall ? kSmallPoolStat : kLargePoolStat; }

// What a memory source asks of the allocator that composes it. Every call
// runs under the allocator's exclusive lock. The memory limit is not here:
// the backend a source is given refuses memory past it (LimitingBackend).
class SourceHost {
 public:
  // A Block from the spares of `stream`'s shard, or of the shard of `like`'s stream.
  virtual Block* NewBlock(StreamHandle stream) = 0;
  virtual Block* NewBlock(const Block* like) = 0;
  virtual void DeleteBlock(Block* block) = 0;
  // The shard a new segment of `stream` belongs to (Segment::shard).
  virtual StreamShard* ShardFor(StreamHandle stream) = 0;

  // The free-block pools, which keep the inactive_split statistics exact.
  virtual void PoolInsert(Block* block) = 0;
  virtual void PoolErase(Block* block) = 0;
  // Caches the remainder of `block` beyond `size` as a block of its own.
  virtual void Split(Block* block, uint64_t size) = 0;
  // Merges a block that became free with free neighbours and caches it.
  virtual Block* CacheFreeBlock(Block* block) = 0;
  // The part of free `block` (out of its pool) from `address` on; what lies
  // below is cached as a block of its own.
  virtual Block* CarveAt(Block* block, DeviceAddress address) = 0;
  // Marks `block` allocated for a request of `size` bytes (`rounded` after
  // rounding) and counts it.
  virtual void HandOut(Block* block, uint64_t size, uint64_t rounded) = 0;

  // The most bytes ever allocated at once, which ResetPeakStats leaves alone.
  virtual int64_t AllocatedHighWater() const = 0;
  // Releases an unmapped physical page counted in reserved_bytes; one the
  // device refuses is kept for a retry (Note [Unreleased pages]).
  virtual absl::Status ReleasePage(PhysicalHandle handle, PoolKind pool) = 0;
  // Adds an entry to the history, when it records.
  virtual void Record(TraceAction action, DeviceAddress address, uint64_t size, StreamHandle stream) = 0;
  // The out-of-memory flush (Note [Out of memory]): every cached segment,
  // free page and pending free.
  virtual absl::Status ReleaseAllCache() = 0;
  // The kResourceExhausted error for a request that nothing could serve.
  virtual absl::Status OutOfMemory(uint64_t size, uint64_t rounded, StreamHandle stream,
                                   const absl::Status& cause) = 0;

 protected:
  ~SourceHost() = default;
};

// What every source is built with: the allocator and what it was given.
struct SourceContext {
  SourceHost* host;
  // The allocator's device behind its memory limit: `limits` itself.
  DeviceBackend* backend;
  const LimitingBackend* limits;
  const AllocatorOptions* options;
  PoolStats* stats;
  uint64_t granularity;  // the device's map granularity, the page of every source
  uint64_t total_bytes;  // the device's memory
};

// The base of every source: the context as members named as the allocator
// names them.
class MemorySource {
 protected:
  explicit MemorySource(const SourceContext& context)
      : host_(context.host),
        backend_(context.backend),
        limits_(context.limits),
        options_(*context.options),
        stats_(*context.stats),
        granularity_(context.granularity),
        total_bytes_(context.total_bytes) {}
  ~MemorySource() = default;

  SourceHost* const host_;
  DeviceBackend* const backend_;
  const LimitingBackend* const limits_;
  const AllocatorOptions& options_;
  PoolStats& stats_;
  const uint64_t granularity_;
  const uint64_t total_bytes_;
};

// What the statistics should say, recomputed from the blocks by the
// validators of the allocator and of each source.
struct Recount {
  StatArray allocation{}, allocated_bytes{}, requested{}, active{}, active_bytes{}, reserved{}, segments{},
      inactive_split{}, inactive_split_bytes{};
  size_t free_blocks = 0;
  size_t pending_events = 0;  // summed over blocks
  size_t stitched_parts = 0;  // blocks flagged Block::stitched_part

  // Adds an allocated or active block.
  void CountActive(const Block& block, size_t pool_stat);
  // Adds a segment that holds `reserved` bytes of device memory.
  void CountSegment(size_t pool_stat, uint64_t reserved);
};

// A macro, not a lambda, so that the format string stays a checked constant.
#define HEADROOM_INVARIANT_ERROR(...) absl::InternalError(absl::StrFormat(__VA_ARGS__))

// A new segment over [address, address + size) whose one block spans it,
// counted in the segment stats; the caller files it.
Segment* NewSegment(SourceHost& host, PoolStats& stats, DeviceAddress address, uint64_t size, PoolKind kind,
                    StreamHandle stream);
// Deletes a segment and its blocks (teardown: nothing is counted).
void DeleteSegment(Segment* segment);
// Unmaps and releases the mapped pages of an expandable segment or the
// planned range, then its reservation (teardown: errors have nowhere to go).
void ReleaseMappedPages(DeviceBackend& backend, const Segment& segment, uint64_t granularity);

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_SOURCES_MEMORY_SOURCE_H_
