// Blocks and segments: the caching allocator's view of device memory.
//
// A Segment is one range obtained from the device: a Malloc, or (expandable
// segments) one address reservation whose pages are mapped on demand. Its
// blocks partition it exactly, in address order, linked by prev/next:
//
//   segment [0x1000 ...................................................)
//           | block A: allocated | block B: free | block C: unmapped ... |
//
// A block is allocated (handed to a caller), pending (freed by the caller
// but still in use by another stream; see Note [Stream-ordered frees]),
// quarantined (its free could not be ordered after those streams), free
// (cached in its pool) or, only in an expandable segment, unmapped.
// Invariants (CachingAllocator::Validate):
//  - blocks tile their segment; sizes and addresses are multiples of 512
//    (unmapped blocks: of the map granularity);
//  - a free block is in exactly one BlockPool and no two free, mapped
//    neighbours with the same stream exist (they are coalesced at free);
//  - mapped blocks of an expandable segment lie in mapped pages only.
#ifndef HEADROOM_ALLOCATOR_BLOCK_H_
#define HEADROOM_ALLOCATOR_BLOCK_H_

#include <cstdint>
#include <vector>

#include "absl/container/btree_set.h"
#include "allocator/device_backend.h"
#include "boost/intrusive/set_hook.hpp"

namespace headroom::internal {

enum class PoolKind : uint8_t { kSmall, kLarge };

struct Segment;

// Links a cached block into its BlockPool's trees (Note [Size bins]). Safe
// mode: unlinking resets the links, and debug builds assert that no block is
// destroyed while still cached.
using PoolHook = boost::intrusive::set_member_hook<boost::intrusive::optimize_size<true>>;

struct Block {
  DeviceAddress address = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;  // caller's size while allocated
  StreamHandle stream;          // the stream this block is reused on
  PoolKind pool = PoolKind::kLarge;
  bool allocated = false;
  bool mapped = true;
  // Counted in inactive_split stats while cached (see CachingAllocator::PoolInsert).
  bool counted_inactive_split = false;
  int pending_events = 0;  // > 0: freed, waiting for other streams
  // Freed, but neither an event nor a host wait could show that the streams
  // that used it are done: kept out of use for good (counted active), since
  // a kernel may still write it (CachingAllocator::FreeAllocatedBlock).
  bool quarantined = false;
  // Allocated as a piece of a stitched block (Note [Stitched blocks]): the
  // caller holds the stitched block, which the statistics count instead.
  bool stitched_part = false;
  Block* prev = nullptr;
  Block* next = nullptr;
  Segment* segment = nullptr;
  // Streams other than `stream` that used the block (RecordStream).
  std::vector<StreamHandle> stream_uses;
  // Value of the pool's lookup counter when the block was cached; the
  // difference to the current value is its age for garbage collection.
  uint64_t cached_at = 0;
  PoolHook pool_hook;  // copying a Block leaves the copy unlinked

  bool is_free() const { return !allocated && pending_events == 0 && !quarantined && mapped; }
  // Allocated, or freed but possibly still used by a stream.
  bool is_active() const { return allocated || pending_events > 0 || quarantined; }
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct StreamShard;

struct BlockByAddress {
  bool operator()(const Block* a, const Block* b) const { return a->address < b->address; }
};

struct Segment {
  DeviceAddress address = 0;
  uint64_t size = 0;  // bytes Malloc'ed, or bytes reserved when expandable
  StreamHandle stream;
  PoolKind pool = PoolKind::kLarge;
  bool expandable = false;
  // A block of it moved to another stream (Note [Cross-stream reuse]), so
  // its blocks' neighbours may belong to another stream shard: from then on
  // its blocks are allocated and freed under the exclusive lock only
  // (Note [Stream shards]).
  bool mixed_streams = false;
  // The range of a stitched block (Note [Stitched blocks]), whose one block
  // maps pieces of other segments' pages: not in the segment map, no memory
  // of its own.
  bool stitched = false;
  // The address range of a layout plan (Note [Following a layout plan]):
  // its blocks are placed by the plan and do not tile it; not in the
  // segment map.
  bool planned = false;
  StreamShard* shard = nullptr;  // of `stream`
  Block* first = nullptr;
  // Expandable segments only (Note [Expandable segments]): one physical
  // handle per granularity page from the segment's start up to the highest
  // mapped page, value 0 where unmapped (pages beyond the end are unmapped;
  // Note [Expandable page table]); and the unmapped blocks in address order.
  std::vector<PhysicalHandle> pages;
  uint64_t mapped_bytes = 0;
  absl::btree_set<Block*, BlockByAddress> unmapped;

  // The handle of page `index`, 0 if unmapped.
  PhysicalHandle PageAt(uint64_t index) const { return index < pages.size() ? pages[index] : PhysicalHandle{}; }
};

// Segment list surgery for coalescing: `block` takes over its neighbour
// before (after) it, growing over the neighbour's bytes and place in the
// list. Returns the neighbour, unlinked; pools and sets are the caller's.
inline Block* AbsorbPrev(Block* block) {
  Block* prev = block->prev;
  block->address = prev->address;
  block->size += prev->size;
  block->prev = prev->prev;
  if (block->prev != nullptr) {
    block->prev->next = block;
  } else {
    block->segment->first = block;
  }
  return prev;
}
inline Block* AbsorbNext(Block* block) {
  Block* next = block->next;
  block->size += next->size;
  block->next = next->next;
  if (block->next != nullptr) block->next->prev = block;
  return next;
}

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_BLOCK_H_
