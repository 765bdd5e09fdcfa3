// Classic segments: one device Malloc per segment, as PyTorch's caching
// allocator without expandable segments. A request that no cached block
// serves gets a segment of SegmentSizeFor(rounded) bytes (2 MiB for small
// requests, 20 MiB below 10 MiB, else the request rounded to 2 MiB), whose
// one block the allocator splits; a segment goes back to the device only
// when all its blocks are cached (the out-of-memory path, EmptyCache,
// garbage collection).
//
//   ClassicSegments segments(context);
//   HEADROOM_ASSIGN_OR_RETURN(Block* block, segments.Allocate(PoolKind::kLarge, stream, rounded));
//   ...
//   if (ClassicSegments::IsWholeCachedSegment(block)) HEADROOM_RETURN_IF_ERROR(segments.Release(block->segment));
//
// Invariants (Validate): every segment is filed under its address and is
// neither expandable, stitched nor planned; the blocks' tiling is the
// allocator's to check (it owns the pools they are cached in).
#ifndef HEADROOM_ALLOCATOR_SOURCES_CLASSIC_SEGMENTS_H_
#define HEADROOM_ALLOCATOR_SOURCES_CLASSIC_SEGMENTS_H_

#include <cstdint>

#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/sources/memory_source.h"

namespace headroom::internal {

class ClassicSegments : MemorySource {
 public:
  explicit ClassicSegments(const SourceContext& context) : MemorySource(context) {}
  ClassicSegments(const ClassicSegments&) = delete;
  ClassicSegments& operator=(const ClassicSegments&) = delete;

  // A new segment for a request of `rounded` bytes, its one block free and
  // out of any pool; kResourceExhausted past the memory limit or where the
  // device refuses.
  absl::StatusOr<Block*> Allocate(PoolKind kind, StreamHandle stream, uint64_t rounded);
  // Returns a segment whose blocks are all cached to the device; on a device
  // error the segment stays as it was.
  absl::Status Release(Segment* segment);
  // True for the first block of a classic segment whose blocks are all
  // cached, so that each releasable segment is found once while scanning a pool.
  static bool IsWholeCachedSegment(const Block* block);

  // The segment holding `address`, or nullptr.
  const Segment* Containing(DeviceAddress address) const;
  // Every segment, by address.
  void ForEachSegment(absl::FunctionRef<void(Segment*)> fn) const;
  absl::Status Validate() const;
  // Frees every segment and deletes its blocks (teardown; errors have
  // nowhere to go).
  void Teardown(Segment* segment);

 private:
  absl::btree_map<DeviceAddress, Segment*> segments_;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_SOURCES_CLASSIC_SEGMENTS_H_
