// Stitched ranges: a request that fails only because the free bytes lie in
// pieces of pages, served by mapping pieces and new pages side by side at a
// new address (Note [Stitched blocks] in stitched_ranges.h).
#include "allocator/sources/stitched_ranges.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "common/checked_math.h"
#include "common/status_macros.h"

namespace headroom::internal {

namespace {

// A free range [start, end) of `block` that ends (a tail) or starts (a head)
// at a page boundary.
struct Piece {
  Block* block = nullptr;
  DeviceAddress start = 0;
  DeviceAddress end = 0;
  uint64_t size() const { return end - start; }
};

// The largest tail (or head) of a free block of `stream` in `segment`, other
// than `except`.
Piece LargestPiece(const Segment& segment, StreamHandle stream, uint64_t page, bool tail,
                   const Block* except) {
  Piece best;
  for (Block* b = segment.first; b != nullptr; b = b->next) {
    if (!b->is_free() || b->stream != stream || b == except) continue;
    const uint64_t offset = b->address - segment.address;
    const uint64_t end = offset + b->size;
    Piece piece{.block = b};
    if (tail) {
      const uint64_t boundary = end / page * page;  // the last at or below the end
      if (boundary <= offset) continue;
      piece.start = b->address;
      piece.end = segment.address + boundary;
    } else {
      const uint64_t boundary = RoundUp(offset, page);  // the first at or above the start
      if (boundary >= end) continue;
      piece.start = segment.address + boundary;
      piece.end = b->address + b->size;
    }
    if (piece.size() > best.size()) best = piece;
  }
  return best;
}

}  // namespace

absl::StatusOr<Block*> StitchedRanges::Allocate(PoolKind kind, uint64_t rounded,
                                                                            StreamHandle stream) {
  Segment* segment = expandable_->Find(stream, kind);
  if (segment == nullptr) return nullptr;
  const uint64_t page = granularity_;

  // The largest tail and head of two different blocks (a block that holds
  // both is contiguous already: best fit saw it whole).
  Piece tail = LargestPiece(*segment, stream, page, /*tail=*/true, nullptr);
  Piece head = LargestPiece(*segment, stream, page, /*tail=*/false, tail.block);
  if (const Piece other_head = LargestPiece(*segment, stream, page, /*tail=*/false, nullptr);
      other_head.block == tail.block && other_head.size() > 0) {
    const Piece other_tail = LargestPiece(*segment, stream, page, /*tail=*/true, other_head.block);
    if (other_tail.size() + other_head.size() > tail.size() + head.size()) {
      tail = other_tail;
      head = other_head;
    }
  }
  auto new_pages_for = [&](uint64_t pieces) { return pieces >= rounded ? 0 : CeilDiv(rounded - pieces, page); };
  const uint64_t new_pages = new_pages_for(tail.size() + head.size());
  if (new_pages == new_pages_for(0)) return nullptr;  // the pieces save no page: growth failed for as many
  // One piece alone where it saves as many pages: fewer pages to map twice.
  if (new_pages_for(tail.size()) == new_pages) {
    head = {};
  } else if (new_pages_for(head.size()) == new_pages) {
    tail = {};
  }

  // What each part takes: with a head, the new pages whole; without, what the tail leaves.
  const uint64_t added_bytes = head.block != nullptr ? new_pages * page : rounded - tail.size();
  const uint64_t head_bytes = rounded - tail.size() - added_bytes;

  // The pieces are carved out first, so that mapping the new pages cannot
  // move their pages (Note [Moving free pages] takes only free blocks' pages).
  Block* tail_part = nullptr;
  Block* added = nullptr;
  Block* head_part = nullptr;
  auto take = [](Block* part) {
    part->allocated = true;
    part->stitched_part = true;
    part->requested_size = part->size;
  };
  auto give_back = [&] {
    std::vector<Block*> taken;
    for (Block* part : {tail_part, added, head_part}) {
      if (part != nullptr) taken.push_back(part);
    }
    CacheParts(taken);
  };
  if (tail.block != nullptr) {
    tail_part = tail.block;
    host_->PoolErase(tail_part);
    if (tail.end < tail_part->address + tail_part->size) host_->Split(tail_part, tail.size());
    take(tail_part);
  }
  if (head.block != nullptr) {
    host_->PoolErase(head.block);
    head_part = host_->CarveAt(head.block, head.start);
    if (head_part->size > head_bytes) host_->Split(head_part, head_bytes);
    take(head_part);
  }
  if (new_pages > 0) {
    // The highest unmapped range: the end of the reservation, larger than the device.
    Block* hole = segment->unmapped.empty() ? nullptr : *std::prev(segment->unmapped.end());
    absl::Status status = hole == nullptr || hole->size < new_pages * page
                              ? absl::ResourceExhaustedError("no unmapped range for the new pages")
                              : expandable_->MapPages(segment, (hole->address - segment->address) / page, new_pages, hole,
                                         /*needs_next=*/false);
    if (!status.ok()) {
      give_back();
      if (absl::IsResourceExhausted(status)) return nullptr;
      return status;
    }
    added = expandable_->TakeMappedRange(segment, hole, new_pages * page, stream);
    if (added->size > added_bytes) host_->Split(added, added_bytes);  // the rest of the last page stays cached
    take(added);
  }
  std::vector<Block*> parts;
  for (Block* part : {tail_part, added, head_part}) {
    if (part != nullptr) parts.push_back(part);
  }

  // Map every page the parts lie on, in order, at a range of their own.
  std::vector<PhysicalHandle> handles;
  for (const Block* part : parts) {
    const uint64_t first = (part->address - segment->address) / page;
    const uint64_t last = CeilDiv(part->address + part->size - segment->address, page);
    for (uint64_t i = first; i < last; ++i) handles.push_back(segment->pages[i]);
  }
  const uint64_t range_bytes = handles.size() * page;
  absl::StatusOr<DeviceAddress> range = backend_->ReserveAddressRange(range_bytes);
  absl::Status status = range.status();
  size_t mapped = 0;
  for (; status.ok() && mapped < handles.size(); ++mapped) {
    status = backend_->Map(*range + mapped * page, page, handles[mapped]);
    if (!status.ok()) break;
  }
  if (status.ok()) status = backend_->SetAccess(*range, range_bytes);
  if (!status.ok()) {
    if (range.ok()) {
      if (mapped > 0) (void)backend_->Unmap(*range, mapped * page);
      (void)backend_->ReleaseAddressRange(*range, range_bytes);
    }
    give_back();
    if (absl::IsResourceExhausted(status)) return nullptr;
    return status;
  }
  stats_.num_pages_mapped += static_cast<int64_t>(handles.size());
  ++stats_.num_stitched_blocks;

  // The caller's block: it starts where the first part starts in its page.
  auto view = std::make_unique<Segment>();
  Block* block = host_->NewBlock(stream);
  block->address = *range + (parts.front()->address - segment->address) % page;
  block->size = rounded;
  block->stream = stream;
  block->pool = kind;
  block->segment = view.get();
  view->address = block->address;
  view->size = rounded;
  view->stream = stream;
  view->pool = kind;
  view->stitched = true;
  view->shard = segment->shard;
  view->first = block;
  stitched_[block->address] = {.range = *range, .range_bytes = range_bytes, .segment = std::move(view),
                               .parts = std::move(parts)};
  // For snapshots, the caller's block is a segment mapped before its alloc (memory_viz draws blocks in segments).
  host_->Record(TraceAction::kSegmentMap, block->address, block->size, stream);
  return block;
}

bool StitchedRanges::Unmap(const Block* block) {
  const Stitched& stitched = stitched_.at(block->address);
  // Its streams are done with it (its free waited for them): the second mapping can go.
  if (!backend_->Unmap(stitched.range, stitched.range_bytes).ok()) return false;
  (void)backend_->ReleaseAddressRange(stitched.range, stitched.range_bytes);  // address space only
  stats_.num_pages_unmapped += static_cast<int64_t>(stitched.range_bytes / granularity_);
  return true;
}

void StitchedRanges::CacheParts(const std::vector<Block*>& parts) {
  for (Block* part : parts) {
    part->stitched_part = false;
    part->allocated = false;
    part->requested_size = 0;
    host_->CacheFreeBlock(part);
  }
}

void StitchedRanges::Drop(Block* block) {
  host_->Record(TraceAction::kSegmentUnmap, block->address, block->size, block->stream);
  auto it = stitched_.find(block->address);
  CacheParts(it->second.parts);
  host_->DeleteBlock(block);
  stitched_.erase(it);
}

void StitchedRanges::UnmapAll() {
  for (auto& [address, stitched] : stitched_) {
    (void)backend_->Unmap(stitched.range, stitched.range_bytes);
    (void)backend_->ReleaseAddressRange(stitched.range, stitched.range_bytes);
    delete stitched.segment->first;
  }
  stitched_.clear();
}

bool StitchedRanges::Contains(DeviceAddress address) const { return stitched_.contains(address); }

void StitchedRanges::ForEachSegment(absl::FunctionRef<void(const Segment&)> fn) const {
  std::vector<const Segment*> by_address;
  for (const auto& [address, block] : stitched_) by_address.push_back(block.segment.get());
  std::sort(by_address.begin(), by_address.end(),
            [](const Segment* a, const Segment* b) { return a->address < b->address; });
  for (const Segment* segment : by_address) fn(*segment);
}

// Each stitched block is counted, its pieces are allocated in their segment,
// sum to its size and lie where its range maps.
absl::Status StitchedRanges::Validate(Recount& recount) const {
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
    recount.CountActive(*block, StatOf(block->pool));
  }
  if (parts != recount.stitched_parts) {
    return HEADROOM_INVARIANT_ERROR("%d stitched pieces in segments, %d held by stitched blocks",
                                    recount.stitched_parts, parts);
  }
  return absl::OkStatus();
}

}  // namespace headroom::internal
