// Stitched ranges: the last resort of a request that would run out of
// memory although enough bytes are free, because they lie in pieces of pages
// that also hold live blocks (Note [Stitched blocks]). The pieces and new
// pages of the request's stream's expandable segment are mapped once more,
// side by side, at an address range of their own.
//
//   StitchedRanges stitched(context, &expandable);
//   HEADROOM_ASSIGN_OR_RETURN(Block* block, stitched.Allocate(kind, rounded, stream));
//   if (block == nullptr) ...  // the pieces save no page: out of memory as before
//   ...  // when its free completes:
//   if (stitched.Unmap(block)) stitched.Drop(block);
//
// Invariants (Validate): each stitched block is the one block of its own
// segment, active, within its mapped range, and its pieces, flagged
// Block::stitched_part in their segments, add up to its size; every piece in
// a segment belongs to one stitched block.
//
// Note [Stitched blocks]
// At the live peak of a training step the free memory that is left often
// lies in pieces of pages that also hold live blocks: on the recorded
// ResNet-50 run (bench/traces), on a device 2 MiB smaller than the smallest
// it ran on, a 2.25 MiB gradient found 6.3 MiB free, none of it in one piece
// of more than 1.5 MiB, and one page left on the device. Expandable segments
// can map a physical page at a second address. With
// AllocatorOptions::stitch_pages, a request that still fails after the
// out-of-memory flush (Note [Out of memory]) takes a free piece that ends at
// a page boundary (a tail), new pages, and a free piece that starts at one
// (a head), all of its stream's segment, and maps their pages once more,
// side by side, in an address range of their own:
//
//   segment's pages   | live  tail | ... | head  live | ... | new |
//   stitched range    |       tail | new | head       |   (the caller's block: tail, new, head)
//
// The pieces are carved out as allocated blocks of their segment (flagged
// Block::stitched_part, uncounted) so that nothing else gets them and their
// pages stay mapped; the caller's block lives in a segment of its own
// (Segment::stitched, in no segment map) and is what the statistics
// count. A tail or head alone is taken where it saves as many pages. Its
// free waits, by an event, for its own stream as well as for the streams
// that used it (the second mapping is unmapped before its pieces are
// reused), then unmaps the range and caches the pieces. Only free bytes
// next to a page boundary can be stitched: pieces between two live blocks
// of one page cannot (on the recorded Llama and T5 runs most are of that
// kind). Stitching happens only where the request would fail, so on a
// device with room nothing changes; it costs a map of each page of the
// range at the allocation and an unmap at the free. Snapshots show the
// caller's block as a segment of its own (allocator/snapshot.h). On the
// recorded runs it took the smallest device that runs the CPU ResNet-50 from
// 1.026x its live peak to 1.020x and T5's from 1.030x to 1.026x, with one
// block stitched in the whole run (bench/RESULTS.md).
#ifndef HEADROOM_ALLOCATOR_SOURCES_STITCHED_RANGES_H_
#define HEADROOM_ALLOCATOR_SOURCES_STITCHED_RANGES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/sources/expandable_segments.h"
#include "allocator/sources/memory_source.h"

namespace headroom::internal {

class StitchedRanges : MemorySource {
 public:
  // The pieces come from `expandable`'s segments, which must outlive this.
  StitchedRanges(const SourceContext& context, ExpandableSegments* expandable)
      : MemorySource(context), expandable_(expandable) {}
  StitchedRanges(const StitchedRanges&) = delete;
  StitchedRanges& operator=(const StitchedRanges&) = delete;

  // A block of `rounded` bytes stitched from free pieces of `stream`'s
  // segment and new pages; nullptr where the pieces save no page or the
  // device is out of memory, an error where it fails otherwise (either way
  // the pieces are free again).
  absl::StatusOr<Block*> Allocate(PoolKind kind, uint64_t rounded, StreamHandle stream);
  // When the free of a stitched block completes: unmaps its range (false,
  // with nothing changed, if the device refuses).
  bool Unmap(const Block* block);
  // Then caches its pieces and drops the block.
  void Drop(Block* block);
  // Unmaps every stitched range (teardown, before the pages are released).
  void UnmapAll();

  // Whether a live stitched block starts at `address`.
  bool Contains(DeviceAddress address) const;
  // Each stitched block's segment, by address (snapshots).
  void ForEachSegment(absl::FunctionRef<void(const Segment&)> fn) const;
  // Adds the stitched blocks to `recount`, whose stitched_parts the
  // segments' validation has counted already.
  absl::Status Validate(Recount& recount) const;

 private:
  // Makes pieces carved for a stitched block free and cached again.
  void CacheParts(const std::vector<Block*>& parts);

  ExpandableSegments* const expandable_;
  // Each live stitched block, by its address, with its address range and the pieces it maps.
  struct Stitched {
    DeviceAddress range = 0;
    uint64_t range_bytes = 0;
    std::unique_ptr<Segment> segment;  // holds the block
    std::vector<Block*> parts;
  };
  absl::flat_hash_map<DeviceAddress, Stitched> stitched_;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_SOURCES_STITCHED_RANGES_H_
