// Expandable segments: one address reservation per (stream, pool) whose
// pages are mapped as it grows and unmapped when trimmed (Note [Expandable
// segments] in expandable_segments.h).
#include "allocator/sources/expandable_segments.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/size_rounding.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom::internal {


absl::StatusOr<Segment*> ExpandableSegments::SegmentFor(PoolKind kind,
                                                                                 StreamHandle stream) {
  if (auto it = segments_.find({stream, kind}); it != segments_.end()) return it->second;
  // Larger than the device: the reservation costs address space only, and
  // pages unmapped below the end leave holes that growth past them must
  // skip. PyTorch reserves 1 1/8 of the device's memory in whole pages of the
  // pool (ExpandableSegment in CUDACachingAllocator.cpp), and so do its
  // presets here, so that a replay runs out of addresses where PyTorch does.
  // Moving free pages (Note [Moving free pages]) leaves a hole at every move:
  // twice the device, so that the memory, not the addresses, runs out first
  // (a recorded LSTM run spans 1.15x the smallest device it fits on).
  const uint64_t wanted = SaturatingAdd(total_bytes_, options_.move_free_pages ? total_bytes_ : total_bytes_ / 8);
  const uint64_t size = RoundUp(wanted, PageBytes(kind == PoolKind::kSmall));
  HEADROOM_ASSIGN_OR_RETURN(DeviceAddress address, backend_->ReserveAddressRange(size));
  Segment* segment = NewSegment(*host_, stats_, address, size, kind, stream);
  // Nothing is mapped yet: the whole reservation is one unmapped block.
  segment->expandable = true;  // no page table yet (Note [Expandable page table])
  segment->first->mapped = false;
  segment->unmapped.insert(segment->first);
  segments_[{stream, kind}] = segment;
  return segment;
}

uint64_t ExpandableSegments::PageBytes(bool small) const {
  const uint64_t option = small ? options_.expandable_small_page_bytes : options_.expandable_large_page_bytes;
  return RoundUp(std::max(option, granularity_), granularity_);
}

absl::Status ExpandableSegments::MapPages(Segment* segment, uint64_t first_page, uint64_t count, const Block* hole,
                                       bool needs_next) {
  const DeviceAddress start = segment->address + first_page * granularity_;
  // Note [Moving free pages]: pages cached elsewhere first, counted here from now on.
  std::vector<PhysicalHandle> moved;
  if (const uint64_t to_move = PagesToMove(count); to_move > 0) {
    TakeFreePages(hole, needs_next, to_move, moved);
    moved_bytes_ += moved.size() * granularity_;
    for (size_t i = 0; i < moved.size(); ++i) {
      stats_.reserved_bytes.Increase(StatOf(segment->pool), static_cast<int64_t>(granularity_));
    }
  }
  // Only the pages created anew count against memory_fraction and hard_limit, checked as one batch so that a
  // batch past the limit creates no page.
  const uint64_t new_bytes = (count - moved.size()) * granularity_;
  if (absl::Status room = new_bytes > 0 ? limits_->CheckRoom(new_bytes) : absl::OkStatus(); !room.ok()) {
    for (PhysicalHandle handle : moved) (void)host_->ReleasePage(handle, segment->pool);
    return room;
  }
  std::vector<PhysicalHandle> mapped;
  absl::Status status;
  for (uint64_t i = 0; i < count && status.ok(); ++i) {
    PhysicalHandle handle;
    if (i < moved.size()) {
      handle = moved[i];
    } else {
      absl::StatusOr<PhysicalHandle> created = backend_->CreatePhysical(granularity_);
      if (!created.ok()) {
        status = created.status();
        break;
      }
      handle = *created;
      // Counted reserved from creation on, so that ReleasePage can uncount it.
      stats_.reserved_bytes.Increase(StatOf(segment->pool), static_cast<int64_t>(granularity_));
      ++stats_.num_device_alloc;
    }
    status = backend_->Map(start + i * granularity_, granularity_, handle);
    if (!status.ok()) {
      (void)host_->ReleasePage(handle, segment->pool);
      break;
    }
    mapped.push_back(handle);
  }
  if (status.ok()) status = backend_->SetAccess(start, count * granularity_);
  if (!status.ok()) {
    // Undo this call's pages so the segment is as before (moved pages go back to the device).
    for (size_t i = 0; i < mapped.size(); ++i) {
      (void)backend_->Unmap(start + i * granularity_, granularity_);
      (void)host_->ReleasePage(mapped[i], segment->pool);
    }
    for (size_t i = mapped.size() + 1; i < moved.size(); ++i) (void)host_->ReleasePage(moved[i], segment->pool);
    return status;
  }
  if (segment->pages.size() < first_page + count) segment->pages.resize(first_page + count);
  for (uint64_t i = 0; i < count; ++i) segment->pages[first_page + i] = mapped[i];
  segment->mapped_bytes += count * granularity_;
  stats_.num_pages_mapped += static_cast<int64_t>(count);
  host_->Record(TraceAction::kSegmentMap, start, count * granularity_, segment->stream);
  return absl::OkStatus();
}

uint64_t ExpandableSegments::PagesToMove(uint64_t count) const {
  if (!options_.move_free_pages) return 0;
  const uint64_t wanted = count * granularity_;
  const auto allocated = static_cast<uint64_t>(stats_.allocated_bytes.current());
  const uint64_t peak = std::max(static_cast<uint64_t>(host_->AllocatedHighWater()), allocated + wanted);
  const uint64_t allowed = limits_->AllowedBytes();
  // The room below the threshold, widened by every page moved so far up to move_threshold_max.
  const double least = static_cast<double>(peak) * options_.move_threshold;
  const double most = static_cast<double>(peak) * std::max(options_.move_threshold, options_.move_threshold_max);
  const double scaled = std::min(least + static_cast<double>(moved_bytes_), most);
  const uint64_t bound = scaled >= static_cast<double>(allowed) ? allowed : static_cast<uint64_t>(scaled);
  const auto reserved = static_cast<uint64_t>(stats_.reserved_bytes.current());
  if (reserved + wanted <= bound) return 0;
  const uint64_t excess = reserved + wanted - std::max(bound, reserved);
  return std::min(count, (excess + granularity_ - 1) / granularity_);
}

uint64_t ExpandableSegments::MovablePages(const Block* block, const Block* hole, bool needs_next) const {
  if (!block->is_free() || !block->mapped) return 0;
  // The request takes the free block below the hole, and the one above it when `needs_next`, so those stay as
  // they are. Otherwise the free block above can give all its pages but its lowest: unmapping that one too would
  // merge the block's range into the hole being mapped.
  const bool above_hole = hole != nullptr && block == hole->next;
  if (hole != nullptr && (block == hole->prev || (above_hole && needs_next))) return 0;
  const DeviceAddress base = block->segment->address;
  const uint64_t first = RoundUp(block->address - base, granularity_);
  const uint64_t last = (block->address + block->size - base) / granularity_ * granularity_;
  if (last <= first) return 0;
  const uint64_t pages = (last - first) / granularity_;
  return above_hole && base + first == block->address ? pages - 1 : pages;
}

uint64_t ExpandableSegments::MoveShortfall(const Block* hole, bool needs_next, uint64_t count) const {
  const uint64_t to_move = PagesToMove(count);
  uint64_t movable = 0;
  for (const auto& [key, segment] : segments_) {
    for (const Block* b = segment->first; b != nullptr && movable < to_move; b = b->next) {
      movable += MovablePages(b, hole, needs_next);
    }
  }
  return to_move > movable ? to_move - movable : 0;
}

void ExpandableSegments::TakeFreePages(const Block* hole, bool needs_next, uint64_t count,
                                     std::vector<PhysicalHandle>& taken) {
  while (taken.size() < count) {
    // The cached block with the most whole pages it can give, of any expandable segment.
    Block* best = nullptr;
    uint64_t best_pages = 0;
    for (const auto& [key, segment] : segments_) {
      for (Block* b = segment->first; b != nullptr; b = b->next) {
        if (const uint64_t pages = MovablePages(b, hole, needs_next); pages > best_pages) {
          best = b;
          best_pages = pages;
        }
      }
    }
    if (best == nullptr) return;
    const size_t before = taken.size();
    // A failed unmap changes nothing (Note [Moving free pages]): the growth creates the rest.
    if (!UnmapFreePages(best, /*synchronized=*/false, std::min(best_pages, count - taken.size()), &taken).ok() ||
        taken.size() == before) {
      return;
    }
  }
}

absl::StatusOr<Block*> ExpandableSegments::Grow(PoolKind kind, StreamHandle stream,
                                                                          uint64_t rounded) {
  HEADROOM_ASSIGN_OR_RETURN(Segment * segment, SegmentFor(kind, stream));
  // Holes left by trimming come first in address order, then the tail: the
  // lowest unmapped range that, with the free block before it (and, if it is
  // mapped whole, the one after it), holds the request.
  // Grow by whole pages (AllocatorOptions::expandable_*_page_bytes), each a
  // multiple of the device granularity; a hole is never overfilled. The
  // request's size picks the page, not the pool: in one pool (Note [One
  // pool]) a small request still maps a small page.
  // When pages move (Note [Moving free pages]), the lowest such range whose
  // growth the free pages can cover: the free blocks around a range are not
  // moved, since the request joins them, and a range between two of them
  // needs pages that a range elsewhere would find there.
  // Note [Page-aligned growth]: a request of a page or more may start at
  // the free block's first page boundary instead of at the block.
  const uint64_t page = PageBytes(IsSmallRequest(rounded));
  Block* chosen = nullptr;
  uint64_t map_bytes = 0;
  bool needs_next = false;  // the request spans the hole into the free block above it
  uint64_t joined = 0;  // the bytes of the free block below that the request takes
  uint64_t chosen_shortfall = std::numeric_limits<uint64_t>::max();
  for (Block* hole : segment->unmapped) {
    auto free_size = [&](const Block* b) { return b != nullptr && b->is_free() && b->stream == stream ? b->size : 0; };
    const uint64_t before = free_size(hole->prev);
    if (before >= rounded) continue;  // declined by the oversize rules; mapping more would not help
    uint64_t bytes = 0;
    bool spans = false;
    uint64_t takes = before;
    if (before + hole->size >= rounded) {
      bytes = std::min(RoundUp(rounded - before, page), hole->size);
      const uint64_t whole = before - before % granularity_;  // the free block's whole pages
      if (AlignsGrowth(rounded) && whole + hole->size >= rounded &&
          std::min(RoundUp(rounded - whole, page), hole->size) == bytes) {
        takes = whole;
      }
    } else if (before + hole->size + free_size(hole->next) >= rounded) {
      bytes = hole->size;
      spans = true;
    } else {
      continue;
    }
    const uint64_t shortfall = options_.move_free_pages ? MoveShortfall(hole, spans, bytes / granularity_) : 0;
    if (shortfall < chosen_shortfall) {
      chosen = hole;
      map_bytes = bytes;
      needs_next = spans;
      joined = takes;
      chosen_shortfall = shortfall;
    }
    if (shortfall == 0) break;
  }
  if (chosen == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "no unmapped range of the %s expandable segment can hold %s", FormatBytes(segment->size), FormatBytes(rounded)));
  }
  HEADROOM_RETURN_IF_ERROR(MapPages(segment, (chosen->address - segment->address) / granularity_,
                                    map_bytes / granularity_, chosen, needs_next));
  Block* mapped = TakeMappedRange(segment, chosen, map_bytes, stream);
  const DeviceAddress start = mapped->address - joined;
  Block* block = host_->CacheFreeBlock(mapped);
  host_->PoolErase(block);
  // The part of the shared page below `start` stays cached (if the free block below was joined after all).
  return host_->CarveAt(block, std::max(start, block->address));
}

Block* ExpandableSegments::TakeMappedRange(Segment* segment, Block* hole, uint64_t bytes,
                                                          StreamHandle stream) {
  segment->unmapped.erase(hole);
  Block* mapped = hole;
  if (bytes < hole->size) {
    mapped = host_->NewBlock(stream);
    mapped->address = hole->address;
    mapped->size = bytes;
    mapped->pool = hole->pool;
    mapped->segment = segment;
    mapped->prev = hole->prev;
    mapped->next = hole;
    if (hole->prev != nullptr) {
      hole->prev->next = mapped;
    } else {
      segment->first = mapped;
    }
    hole->prev = mapped;
    hole->address += bytes;
    hole->size -= bytes;
    segment->unmapped.insert(hole);
  }
  mapped->mapped = true;
  mapped->stream = stream;
  return mapped;
}

absl::StatusOr<uint64_t> ExpandableSegments::UnmapFreePages(Block* block, bool synchronized, uint64_t max_pages,
                                                          std::vector<PhysicalHandle>* kept) {
  Segment* segment = block->segment;
  DeviceAddress start = segment->address + RoundUp(block->address - segment->address, granularity_);
  const DeviceAddress end = segment->address + (block->address + block->size - segment->address) / granularity_ *
                                                   granularity_;
  if (end <= start) return 0;
  if ((end - start) / granularity_ > max_pages) start = end - max_pages * granularity_;  // the block's last pages
  // Kernels queued on the owning stream before the free may still touch the
  // pages; the driver does not order unmapping after them.
  if (!synchronized) {
    HEADROOM_RETURN_IF_ERROR(backend_->SynchronizeStream(segment->stream));
    if (block->stream != segment->stream) HEADROOM_RETURN_IF_ERROR(backend_->SynchronizeStream(block->stream));
  }
  HEADROOM_RETURN_IF_ERROR(backend_->Unmap(start, end - start));
  const uint64_t first_page = (start - segment->address) / granularity_;
  const uint64_t pages = (end - start) / granularity_;
  absl::Status release_error;
  for (uint64_t p = first_page; p < first_page + pages; ++p) {
    if (kept != nullptr) {  // Note [Moving free pages]: the caller maps it elsewhere and counts it there
      kept->push_back(segment->pages[p]);
      stats_.reserved_bytes.Decrease(StatOf(segment->pool), static_cast<int64_t>(granularity_));
    } else {
      absl::Status status = host_->ReleasePage(segment->pages[p], segment->pool);
      if (!status.ok() && release_error.ok()) release_error = status;
    }
    segment->pages[p] = PhysicalHandle{};
  }
  // Note [Expandable page table]: the table ends at the highest mapped page.
  while (!segment->pages.empty() && segment->pages.back().value == 0) segment->pages.pop_back();
  segment->mapped_bytes -= end - start;
  stats_.num_pages_unmapped += static_cast<int64_t>(pages);
  host_->Record(TraceAction::kSegmentUnmap, start, end - start, segment->stream);

  // [head: still mapped, free][middle: unmapped][tail: still mapped, free]
  host_->PoolErase(block);
  auto carve = [&](DeviceAddress address, uint64_t size, Block* prev,
                   Block* next) {
    Block* piece = host_->NewBlock(block);
    piece->address = address;
    piece->size = size;
    piece->stream = block->stream;
    piece->pool = block->pool;
    piece->segment = segment;
    piece->prev = prev;
    piece->next = next;
    return piece;
  };
  if (start > block->address) {
    Block* head = carve(block->address, start - block->address, block->prev, block);
    if (head->prev != nullptr) {
      head->prev->next = head;
    } else {
      segment->first = head;
    }
    block->prev = head;
    host_->PoolInsert(head);
  }
  if (end < block->address + block->size) {
    Block* tail = carve(end, block->address + block->size - end, block, block->next);
    if (tail->next != nullptr) tail->next->prev = tail;
    block->next = tail;
    host_->PoolInsert(tail);
  }
  block->address = start;
  block->size = end - start;
  block->mapped = false;
  block->stream = segment->stream;
  // Merge with unmapped neighbours so that holes stay maximal.
  if (Block* prev = block->prev; prev != nullptr && !prev->mapped) {
    segment->unmapped.erase(prev);
    host_->DeleteBlock(AbsorbPrev(block));
  }
  if (Block* next = block->next; next != nullptr && !next->mapped) {
    segment->unmapped.erase(next);
    host_->DeleteBlock(AbsorbNext(block));
  }
  segment->unmapped.insert(block);
  if (!release_error.ok()) return release_error;
  return end - start;
}

absl::StatusOr<uint64_t> ExpandableSegments::Trim(Segment* segment) {
  std::vector<Block*> free_blocks;
  std::vector<StreamHandle> streams = {segment->stream};
  for (Block* b = segment->first; b != nullptr; b = b->next) {
    if (!b->is_free()) continue;
    free_blocks.push_back(b);
    // Cross-stream reuse may have moved the block to another stream.
    if (std::find(streams.begin(), streams.end(), b->stream) == streams.end()) streams.push_back(b->stream);
  }
  if (free_blocks.empty()) return 0;
  for (StreamHandle stream : streams) HEADROOM_RETURN_IF_ERROR(backend_->SynchronizeStream(stream));
  if (streams.size() > 1) {
    // With every stream idle, a free block's stream no longer matters: give
    // them back to the segment's stream and coalesce, so that pages shared by
    // neighbours of different streams can be unmapped too.
    for (Block* b = segment->first; b != nullptr;) {
      if (b->is_free() && b->stream != segment->stream) {
        host_->PoolErase(b);
        b->stream = segment->stream;
        b = host_->CacheFreeBlock(b);
      }
      b = b->next;
    }
    free_blocks.clear();
    for (Block* b = segment->first; b != nullptr; b = b->next) {
      if (b->is_free()) free_blocks.push_back(b);
    }
  }
  uint64_t released = 0;
  for (Block* block : free_blocks) {
    HEADROOM_ASSIGN_OR_RETURN(uint64_t bytes, UnmapFreePages(block, /*synchronized=*/true));
    released += bytes;
  }
  return released;
}

absl::StatusOr<uint64_t> ExpandableSegments::Trim(PoolKind kind, uint64_t bytes) {
  uint64_t released = 0;
  for (auto& [key, segment] : segments_) {
    if (key.second != kind) continue;
    HEADROOM_ASSIGN_OR_RETURN(uint64_t unmapped, Trim(segment));
    released += unmapped;
    if (released >= bytes) break;
  }
  return released;
}

absl::Status ExpandableSegments::TrimAll() {
  for (auto& [key, segment] : segments_) {
    HEADROOM_ASSIGN_OR_RETURN(uint64_t unmapped, Trim(segment));
    (void)unmapped;
  }
  return absl::OkStatus();
}

absl::Status ExpandableSegments::ReleaseEmptyReservations() {
  std::vector<std::pair<StreamHandle, PoolKind>> empty;
  for (auto& [key, segment] : segments_) {
    if (segment->mapped_bytes == 0) empty.push_back(key);
  }
  for (const auto& key : empty) {
    Segment* segment = segments_[key];
    HEADROOM_RETURN_IF_ERROR(backend_->ReleaseAddressRange(segment->address, segment->size));
    stats_.segment.Decrease(StatOf(segment->pool), 1);
    segments_.erase(key);
    host_->DeleteBlock(segment->first);
    delete segment;
  }
  return absl::OkStatus();
}

Segment* ExpandableSegments::Find(StreamHandle stream, PoolKind kind) const {
  auto it = segments_.find({stream, kind});
  return it == segments_.end() ? nullptr : it->second;
}

const Segment* ExpandableSegments::Containing(DeviceAddress address) const {
  for (const auto& [key, segment] : segments_) {
    if (address >= segment->address && address < segment->address + segment->size) return segment;
  }
  return nullptr;
}

void ExpandableSegments::ForEachSegment(absl::FunctionRef<void(Segment*)> fn) const {
  std::vector<Segment*> by_address;
  by_address.reserve(segments_.size());
  for (const auto& [key, segment] : segments_) by_address.push_back(segment);
  std::sort(by_address.begin(), by_address.end(),
            [](const Segment* a, const Segment* b) { return a->address < b->address; });
  for (Segment* segment : by_address) fn(segment);
}

absl::Status ExpandableSegments::Validate() const {
  for (const auto& [key, segment] : segments_) {
    if (!segment->expandable || segment->stream != key.first || segment->pool != key.second) {
      return HEADROOM_INVARIANT_ERROR("segment 0x%x: filed as the expandable segment of stream %d, pool %d",
                                      segment->address, key.first.value, static_cast<int>(key.second));
    }
    HEADROOM_RETURN_IF_ERROR(ValidatePages(*segment));
  }
  return absl::OkStatus();
}

// Note [Expandable page table]: pages beyond the table are unmapped, so every
// loop here stops at the table's end, however large the reservation.
absl::Status ExpandableSegments::ValidatePages(const Segment& segment) const {
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

void ExpandableSegments::Teardown(Segment* segment) {
  ReleaseMappedPages(*backend_, *segment, granularity_);
  segments_.erase({segment->stream, segment->pool});
  DeleteSegment(segment);
}

}  // namespace headroom::internal
