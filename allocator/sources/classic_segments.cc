#include "allocator/sources/classic_segments.h"

#include <iterator>

#include "absl/strings/str_format.h"
#include "allocator/size_rounding.h"
#include "common/status_macros.h"

namespace headroom::internal {

absl::StatusOr<Block*> ClassicSegments::Allocate(PoolKind kind, StreamHandle stream, uint64_t rounded) {
  const uint64_t size = SegmentSizeFor(rounded);
  // Past the memory limit the LimitingBackend refuses, as the device would.
  HEADROOM_ASSIGN_OR_RETURN(DeviceAddress address, backend_->Malloc(size));
  ++stats_.num_device_alloc;
  Segment* segment = NewSegment(*host_, stats_, address, size, kind, stream);
  segments_[address] = segment;
  stats_.reserved_bytes.Increase(StatOf(kind), static_cast<int64_t>(size));
  if (size >= options_.max_split_size) stats_.oversize_segments.Increase(1);
  host_->Record(TraceAction::kSegmentAlloc, address, size, stream);
  return segment->first;
}

// The segment's blocks are all free: usually one coalesced block, several
// when cross-stream reuse left neighbours of different streams. Free()
// synchronizes the device (as cudaFree does), so their streams need no wait.
absl::Status ClassicSegments::Release(Segment* segment) {
  for (Block* b = segment->first; b != nullptr; b = b->next) host_->PoolErase(b);
  if (absl::Status status = backend_->Free(segment->address); !status.ok()) {
    for (Block* b = segment->first; b != nullptr; b = b->next) host_->PoolInsert(b);
    return status;
  }
  ++stats_.num_device_free;
  stats_.segment.Decrease(StatOf(segment->pool), 1);
  stats_.reserved_bytes.Decrease(StatOf(segment->pool), static_cast<int64_t>(segment->size));
  if (segment->size >= options_.max_split_size) stats_.oversize_segments.Decrease(1);
  host_->Record(TraceAction::kSegmentFree, segment->address, segment->size, segment->stream);
  segments_.erase(segment->address);
  for (Block* b = segment->first; b != nullptr;) {
    Block* next = b->next;
    host_->DeleteBlock(b);
    b = next;
  }
  delete segment;
  return absl::OkStatus();
}

bool ClassicSegments::IsWholeCachedSegment(const Block* block) {
  if (block->segment->expandable || block->prev != nullptr) return false;
  for (const Block* b = block; b != nullptr; b = b->next) {
    if (!b->is_free()) return false;
  }
  return true;
}

const Segment* ClassicSegments::Containing(DeviceAddress address) const {
  auto it = segments_.upper_bound(address);
  if (it == segments_.begin()) return nullptr;
  const Segment* segment = std::prev(it)->second;
  return address < segment->address + segment->size ? segment : nullptr;
}

void ClassicSegments::ForEachSegment(absl::FunctionRef<void(Segment*)> fn) const {
  for (const auto& [address, segment] : segments_) fn(segment);
}

absl::Status ClassicSegments::Validate() const {
  for (const auto& [address, segment] : segments_) {
    if (segment->address != address) {
      return HEADROOM_INVARIANT_ERROR("segment 0x%x filed under 0x%x", segment->address, address);
    }
    if (segment->expandable || segment->stitched || segment->planned) {
      return HEADROOM_INVARIANT_ERROR("segment 0x%x: filed as a classic segment but is not one", address);
    }
  }
  return absl::OkStatus();
}

void ClassicSegments::Teardown(Segment* segment) {
  (void)backend_->Free(segment->address);
  segments_.erase(segment->address);
  DeleteSegment(segment);
}

}  // namespace headroom::internal
