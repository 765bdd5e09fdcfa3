// Expandable segments: instead of one Malloc per segment, one address
// reservation per (stream, pool), larger than the device, whose pages are
// mapped as it grows and unmapped when the cache is trimmed (Note
// [Expandable segments]).
//
//   ExpandableSegments expandable(context);
//   HEADROOM_ASSIGN_OR_RETURN(Block* block, expandable.Grow(PoolKind::kLarge, stream, rounded));
//   ...  // the block is free and out of any pool: the allocator hands it out
//   HEADROOM_ASSIGN_OR_RETURN(uint64_t released, expandable.Trim(PoolKind::kLarge, bytes));
//
// Invariants (Validate): each segment is filed under its (stream, pool);
// its page table ends at its highest mapped page, mapped blocks lie on
// mapped pages and unmapped ones on unmapped pages, and mapped_bytes counts
// the mapped pages (Note [Expandable page table]). The blocks' tiling is the
// allocator's to check.
//
// Note [Expandable segments]
// Instead of one Malloc per segment, each (stream, pool) gets one virtual
// address reservation larger than the device (1 1/8 of it as in PyTorch;
// twice it when pages move, which leaves holes), and physical pages of the map
// granularity are created and mapped at its end as it grows. A request that
// fits no cached block maps just enough pages behind the last free block, so
// consecutive growing requests stay contiguous and the reserved-to-allocated
// overhead is bounded by one page per (stream, pool) instead of by the
// segment-size rounding and splitting rules. EmptyCache and the OOM path
// unmap and release the pages wholly inside free blocks (after synchronizing
// the owning stream: kernels queued there may still touch them); the holes
// they leave are refilled, lowest address first, before the end grows.
//
// Note [Expandable page table]
// The reservation is larger than the device, but its page table
// (Segment::pages) holds only the pages up to the highest one mapped: it
// grows as pages are mapped and shrinks when the tail is unmapped. Sizing it
// from the capacity up front cost 8 bytes per page of the whole device: on a
// simulated 4 PiB device that was 16 GiB of host memory before the first
// allocation. Host memory now follows the device memory actually mapped, and
// every loop over pages is bounded by the table, never by the reservation.
//
// Note [Moving free pages]
// With AllocatorOptions::move_free_pages, free physical pages go where they
// are needed instead of waiting for an out-of-memory flush: before an
// expandable segment creates pages to grow, it unmaps whole free pages of
// cached blocks of any expandable segment (the small pool's for the large
// one, another stream's, or a hole of its own), the largest free run first,
// and maps those handles instead, so the allocator's reserved memory follows
// what all pools need at once rather than the sum of each pool's own high
// water mark. A moved page costs an unmap and a map and no device memory;
// like any unmap, it first synchronizes the stream that last used the block.
// Its reserved bytes move from one pool's statistic to the other's.
// Moving is lazy and bounded by AllocatorOptions::move_threshold: growth
// creates pages while reserved memory stays within that multiple of the
// most bytes ever allocated at once (ResetPeakStats does not lower it) and
// within the memory limit, and moves only the pages
// that would go past it. Moving every time (threshold 1) needs the least
// memory, but on real training loops it moves pages back and forth every
// step, a pool taking what another gives back later; a few percent of room
// lets the pages settle where each step uses them.
//   A fixed room is not always enough. Best fit places a step's blocks a
// little differently each time, and a move itself shifts the layout: on a
// recorded LSTM run, every step's last large block needed three pages past
// the end, moved from a free run below, which pushed the next step's blocks
// three pages higher; the segment crept upward by 6 MiB a step, leaving a
// hole behind at each move. So each page moved widens the room by a page,
// up to AllocatorOptions::move_threshold_max: a loop that keeps moving gets
// the room its drift needs and then stops moving, and one that never moved
// keeps the tighter room (bench/RESULTS.md, real PyTorch runs).
//   The free blocks a request joins are not moved: the one below the range
// it maps, and the one above if the request spans the range into it. A free
// block above the range that the request does not need gives all its pages
// but its lowest, which keeps it apart from the range. Where the lowest
// range that fits lies between two free blocks the request joins, their
// pages cannot cover the growth, so growth goes to the lowest range whose
// growth free pages can cover, and creates pages past the room only where
// none can. On a recorded GPU LSTM run, whose 128 MiB block came back
// between two free 66 MiB blocks, the first rule took reserved memory from
// 1.132x the live peak to 1.048x over six steps, but over 42 steps it still
// reached 1.126x; with the second it stays at 1.048x (bench/RESULTS.md).
//
// Note [Page-aligned growth]
// Growth maps pages past the free block at the end of the mapped range and
// hands out that block and the new pages as one, so a large block starts in
// the free tail of a page that small blocks below it still use. Once those
// are freed, the page's free part stays mapped beside the large block for as
// long as it lives, too small for anything large: on a recorded GPU LSTM
// whose cuDNN buffers of 64 to 128 MiB each started mid-page, such pieces
// held 15 MiB at the live peak, and the smallest device that ran it was
// 1.025x the peak. With AllocatorOptions::align_growth, a request of a page
// or more starts at the free block's first page boundary instead, whenever
// that maps no more pages (always for a request of whole pages), and the
// tail of the shared page stays cached for small blocks. On the recorded
// runs (bench/RESULTS.md) it took the GPU LSTM's smallest device to 1.019x,
// and a recorded T5 stopped mapping a page after its second step; applied
// only from 8 to 32 MiB up, it gained the LSTM a little more but left T5
// mapping or other runs worse (sizes tried in RESULTS). Aligning also where
// it maps a page more met the 1.02x goal on the CPU ResNet-50 only when
// applied from 6 or 8 MiB, cost two other runs memory and left more random
// loops moving pages: not done.
#ifndef HEADROOM_ALLOCATOR_SOURCES_EXPANDABLE_SEGMENTS_H_
#define HEADROOM_ALLOCATOR_SOURCES_EXPANDABLE_SEGMENTS_H_

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/sources/memory_source.h"

namespace headroom::internal {

class ExpandableSegments : MemorySource {
 public:
  explicit ExpandableSegments(const SourceContext& context) : MemorySource(context) {}
  ExpandableSegments(const ExpandableSegments&) = delete;
  ExpandableSegments& operator=(const ExpandableSegments&) = delete;

  // Maps pages of `stream`'s segment of pool `kind` (reserved at its first
  // growth) for a request of `rounded` bytes that no cached block serves;
  // returns the block that holds it, free and out of any pool.
  // kResourceExhausted past the memory limit, where the device refuses, or
  // where no unmapped range holds the request.
  absl::StatusOr<Block*> Grow(PoolKind kind, StreamHandle stream, uint64_t rounded);
  // Maps `count` pages at `first_page`, the start of unmapped block `hole`,
  // for a request that `needs_next` free block above the hole too.
  absl::Status MapPages(Segment* segment, uint64_t first_page, uint64_t count, const Block* hole, bool needs_next);
  // The first `bytes` of unmapped block `hole`, just mapped by MapPages, as
  // a mapped block of `stream` (neither cached nor merged); the rest of the
  // hole stays unmapped.
  Block* TakeMappedRange(Segment* segment, Block* hole, uint64_t bytes, StreamHandle stream);
  // Unmaps the pages wholly inside the free block, first synchronizing its
  // stream unless `synchronized`; returns the bytes released.
  // At most `max_pages` pages, the block's last; with `kept`, the pages are
  // not released but handed over, uncounted (Note [Moving free pages]).
  absl::StatusOr<uint64_t> UnmapFreePages(Block* block, bool synchronized,
                                          uint64_t max_pages = std::numeric_limits<uint64_t>::max(),
                                          std::vector<PhysicalHandle>* kept = nullptr);
  // Unmaps the free pages of the segments of pool `kind` until at least
  // `bytes` are released; returns the bytes released.
  absl::StatusOr<uint64_t> Trim(PoolKind kind, uint64_t bytes);
  // Unmaps the free pages of every segment.
  absl::Status TrimAll();
  // Returns the reservations with nothing mapped (EmptyCache).
  absl::Status ReleaseEmptyReservations();

  // The segment of (`stream`, `kind`), or nullptr.
  Segment* Find(StreamHandle stream, PoolKind kind) const;
  // The segment whose reservation holds `address`, or nullptr.
  const Segment* Containing(DeviceAddress address) const;
  // Every segment, by address.
  void ForEachSegment(absl::FunctionRef<void(Segment*)> fn) const;
  absl::Status Validate() const;
  // Unmaps and releases the segment's pages and reservation and deletes its
  // blocks (teardown; errors have nowhere to go).
  void Teardown(Segment* segment);

 private:
  absl::StatusOr<Segment*> SegmentFor(PoolKind kind, StreamHandle stream);
  // The bytes a segment grows by for a small or a large request: the
  // option's page, in whole device pages.
  uint64_t PageBytes(bool small) const;
  // Note [Page-aligned growth]: whether growth for `rounded` bytes may start
  // at a page boundary of the free block it joins.
  bool AlignsGrowth(uint64_t rounded) const { return options_.align_growth && rounded >= granularity_; }
  // How many of `count` pages about to be mapped must be moved rather than
  // created: those past move_threshold or the memory limit (Note [Moving
  // free pages]); 0 without move_free_pages.
  uint64_t PagesToMove(uint64_t count) const;
  // Whole free pages of `block` that a growth into `hole` may move (Note
  // [Moving free pages]): none of the free blocks the request joins.
  uint64_t MovablePages(const Block* block, const Block* hole, bool needs_next) const;
  // How many of the pages a growth of `count` pages into `hole` must move
  // the free pages elsewhere cannot cover (created past the room instead).
  uint64_t MoveShortfall(const Block* hole, bool needs_next, uint64_t count) const;
  // Unmaps up to `count` whole free pages of cached blocks for mapping into
  // `hole` (Note [Moving free pages]), for a request that `needs_next` free
  // block above it too; stops at the first unmap the device refuses, which
  // leaves that block as it was.
  void TakeFreePages(const Block* hole, bool needs_next, uint64_t count, std::vector<PhysicalHandle>& taken);
  // Unmaps the free pages of one segment, after synchronizing its streams.
  absl::StatusOr<uint64_t> Trim(Segment* segment);
  // The page table against the mapped and unmapped blocks and mapped_bytes.
  absl::Status ValidatePages(const Segment& segment) const;

  absl::flat_hash_map<std::pair<StreamHandle, PoolKind>, Segment*> segments_;
  // Bytes of free pages moved so far; each widens the room (move_threshold_max).
  uint64_t moved_bytes_ = 0;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_SOURCES_EXPANDABLE_SEGMENTS_H_
