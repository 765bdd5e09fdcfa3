// Following a layout plan: requests placed where a plan made from a recorded
// run put them, in an address range of the plan's own. See Note [Following a
// layout plan] in caching_allocator.h.
#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {

std::string CachingAllocator::PlanDeparture() const {
  ExclusiveLock lock(this);
  return planned_.departure;
}

CachingAllocator::Block* CachingAllocator::Depart(std::string reason) {
  following_plan_.store(false, std::memory_order_relaxed);
  planned_.departure = std::move(reason);
  return nullptr;
}

absl::StatusOr<CachingAllocator::Block*> CachingAllocator::AllocatePlanned(uint64_t size, StreamHandle stream) {
  const LayoutPlan& plan = *options_.layout_plan;
  const uint64_t n = planned_.requests;
  const PlannedBlock* planned = plan.At(n);
  if (planned == nullptr) {
    return Depart(absl::StrFormat("request %d: the plan ends after %d requests", n, plan.blocks.size()));
  }
  if (planned_.segment == nullptr) {
    // Without its range the plan cannot be followed; the policy still can serve the job. A range past twice the
    // device (what an expandable segment that moves pages reserves) is no plan for it, and would size the page
    // tables from an absurd offset.
    const uint64_t range_bytes = RoundUp(plan.extent_bytes(), granularity_);
    if (range_bytes / 2 > total_bytes_) {
      return Depart(absl::StrFormat("request %d: the plan's address range of %s is more than twice the device's %s",
                                    n, FormatBytes(range_bytes), FormatBytes(total_bytes_)));
    }
    if (absl::Status reserved = ReservePlannedRange(stream, range_bytes); !reserved.ok()) {
      return Depart(absl::StrFormat("request %d: the plan's address range of %s could not be reserved: %s", n,
                                    FormatBytes(range_bytes), reserved.message()));
    }
  }
  Segment* range = planned_.segment.get();
  if (stream != range->stream) {
    return Depart(absl::StrFormat("request %d is on stream %d; the plan's requests are on stream %d", n,
                                  stream.value, range->stream.value));
  }
  if (RoundUp(size, kMinBlockSize) != planned->size) {
    return Depart(absl::StrFormat("request %d asks for %d bytes; the plan has %d there", n, size, planned->size));
  }
  const DeviceAddress address = range->address + planned->offset;
  const DeviceAddress end = address + planned->size;
  auto after = planned_.live.lower_bound(address);
  const Block* in_use = nullptr;
  if (after != planned_.live.end() && after->first < end) {
    in_use = after->second;
  } else if (after != planned_.live.begin()) {
    const Block* before = std::prev(after)->second;
    if (before->address + before->size > address) in_use = before;
  }
  if (in_use != nullptr) {
    return Depart(absl::StrFormat(
        "request %d: its planned range [+%d, +%d) still holds a block at +%d %s (freed later than in the recorded "
        "run)",
        n, planned->offset, planned->offset + planned->size, in_use->address - range->address,
        in_use->allocated ? "not yet freed" : "waiting for other streams"));
  }

  const auto [first, last] = PlannedPages(address, planned->size);
  // Note [Expandable page table]: the tables grow with the pages the plan touches, not with its range.
  if (planned_.users.size() <= last) planned_.users.resize(last + 1, 0);
  absl::Status mapped;
  // A new page or one moved in the range first; then the out-of-memory flush (Note [Out of memory]), which also
  // releases the range's unused pages, those just mapped for this request among them: so all are checked again.
  for (int attempt = 0; attempt < 2; ++attempt) {
    mapped = absl::OkStatus();
    for (uint64_t page = first; page <= last && mapped.ok(); ++page) {
      if (range->PageAt(page).value == 0) mapped = MapPlannedPage(page, first, last);
    }
    if (mapped.ok() || !absl::IsResourceExhausted(mapped) || attempt == 1) break;
    ++stats_.num_alloc_retries;
    HEADROOM_RETURN_IF_ERROR(ReleaseAllCache());
  }
  if (!mapped.ok()) {
    if (!absl::IsResourceExhausted(mapped)) return mapped;
    return OutOfMemory(size, planned->size, stream, mapped);
  }

  ++planned_.requests;
  Block* block = NewBlock(stream);
  block->address = address;
  block->size = planned->size;
  block->stream = stream;
  block->pool = PoolKind::kLarge;
  block->segment = range;
  for (uint64_t page = first; page <= last; ++page) ++planned_.users[page];
  planned_.live.emplace(address, block);
  ++stats_.num_planned_allocs;
  HandOut(block, size, planned->size);
  return block;
}

absl::Status CachingAllocator::ReservePlannedRange(StreamHandle stream, uint64_t bytes) {
  HEADROOM_ASSIGN_OR_RETURN(DeviceAddress address, backend_->ReserveAddressRange(bytes));
  auto segment = std::make_unique<Segment>();
  segment->address = address;
  segment->size = bytes;
  segment->stream = stream;
  segment->pool = PoolKind::kLarge;
  segment->planned = true;
  segment->shard = &ShardOf(stream);
  planned_.segment = std::move(segment);
  stats_.segment.Increase(StatOf(PoolKind::kLarge), 1);
  return absl::OkStatus();
}

std::pair<uint64_t, uint64_t> CachingAllocator::PlannedPages(DeviceAddress address, uint64_t size) const {
  const uint64_t offset = address - planned_.segment->address;
  return {offset / granularity_, (offset + size - 1) / granularity_};
}

absl::Status CachingAllocator::MapPlannedPage(uint64_t page, uint64_t first, uint64_t last) {
  Segment* range = planned_.segment.get();
  absl::StatusOr<PhysicalHandle> handle = CreatePlannedPage();
  if (!handle.ok() && absl::IsResourceExhausted(handle.status())) {
    // A page of the range no live block touches, the highest, outside the request's own pages.
    for (uint64_t unused = planned_.users.size(); unused-- > 0;) {
      if (planned_.users[unused] != 0 || range->PageAt(unused).value == 0 || (unused >= first && unused <= last)) {
        continue;
      }
      handle = UnmapPlannedPage(unused);
      break;
    }
  }
  if (!handle.ok()) return handle.status();
  const DeviceAddress address = range->address + page * granularity_;
  absl::Status status = backend_->Map(address, granularity_, *handle);
  if (status.ok()) {
    status = backend_->SetAccess(address, granularity_);
    if (!status.ok()) (void)backend_->Unmap(address, granularity_);
  }
  if (!status.ok()) {
    (void)ReleasePage(*handle, PoolKind::kLarge);
    return status;
  }
  if (range->pages.size() <= page) range->pages.resize(page + 1);
  range->pages[page] = *handle;
  range->mapped_bytes += granularity_;
  ++stats_.num_pages_mapped;
  Record(TraceAction::kSegmentMap, address, granularity_, range->stream);
  return absl::OkStatus();
}

absl::StatusOr<PhysicalHandle> CachingAllocator::CreatePlannedPage() {
  const auto reserved = static_cast<uint64_t>(stats_.reserved_bytes.current());
  const uint64_t allowed = AllowedBytesLocked();
  if (granularity_ > allowed || reserved > allowed - granularity_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("mapping %s more would exceed the limit of %s", FormatBytes(granularity_),
                        FormatBytes(allowed)));
  }
  HEADROOM_ASSIGN_OR_RETURN(PhysicalHandle handle, backend_->CreatePhysical(granularity_));
  stats_.reserved_bytes.Increase(StatOf(PoolKind::kLarge), static_cast<int64_t>(granularity_));
  ++stats_.num_device_alloc;
  return handle;
}

absl::StatusOr<PhysicalHandle> CachingAllocator::UnmapPlannedPage(uint64_t page, bool synchronized) {
  Segment* range = planned_.segment.get();
  // Kernels queued before the frees of the blocks that touched it may still do.
  if (!synchronized) HEADROOM_RETURN_IF_ERROR(backend_->SynchronizeStream(range->stream));
  const DeviceAddress address = range->address + page * granularity_;
  HEADROOM_RETURN_IF_ERROR(backend_->Unmap(address, granularity_));
  const PhysicalHandle handle = range->pages[page];
  range->pages[page] = PhysicalHandle{};
  range->mapped_bytes -= granularity_;
  ++stats_.num_pages_unmapped;
  Record(TraceAction::kSegmentUnmap, address, granularity_, range->stream);
  return handle;
}

void CachingAllocator::ReleasePlanned(Block* block) {
  const auto [first, last] = PlannedPages(block->address, block->size);
  for (uint64_t page = first; page <= last; ++page) --planned_.users[page];
  planned_.live.erase(block->address);
  DeleteBlock(block);
}

absl::Status CachingAllocator::ReleaseUnusedPlannedPages() {
  const Segment* range = planned_.segment.get();
  if (range == nullptr || range->mapped_bytes == 0) return absl::OkStatus();
  HEADROOM_RETURN_IF_ERROR(backend_->SynchronizeStream(range->stream));
  absl::Status first_error;
  for (uint64_t page = 0; page < planned_.users.size(); ++page) {
    if (planned_.users[page] != 0 || range->PageAt(page).value == 0) continue;
    HEADROOM_ASSIGN_OR_RETURN(PhysicalHandle handle, UnmapPlannedPage(page, /*synchronized=*/true));
    if (absl::Status status = ReleasePage(handle, PoolKind::kLarge); !status.ok() && first_error.ok()) {
      first_error = status;
    }
  }
  return first_error;
}

void CachingAllocator::AddPlannedSnapshot(AllocatorSnapshot& snapshot) const {
  const Segment* range = planned_.segment.get();
  if (range == nullptr) return;
  // One snapshot segment per run of mapped pages, as for expandable segments; free gaps as inactive blocks.
  const uint64_t pages = range->pages.size();
  for (uint64_t page = 0; page < pages;) {
    if (range->pages[page].value == 0) {
      ++page;
      continue;
    }
    uint64_t end_page = page;
    while (end_page < pages && range->pages[end_page].value != 0) ++end_page;
    SegmentSnapshot segment{.address = range->address + page * granularity_,
                            .total_size = (end_page - page) * granularity_,
                            .stream = range->stream,
                            .expandable = true,
                            .planned = true};
    DeviceAddress at = segment.address;
    const DeviceAddress run_end = segment.address + segment.total_size;
    auto add_free = [&](DeviceAddress until) {
      if (until > at) segment.blocks.push_back({.address = at, .size = until - at, .state = BlockState::kInactive});
    };
    for (auto it = planned_.live.lower_bound(segment.address); it != planned_.live.end() && it->first < run_end;
         ++it) {
      const Block* b = it->second;
      add_free(b->address);
      BlockSnapshot block{.address = b->address, .size = b->size, .requested_size = b->requested_size};
      if (b->allocated) {
        block.state = BlockState::kActiveAllocated;
        segment.allocated_size += b->size;
        segment.requested_size += b->requested_size;
      } else {
        block.state = BlockState::kActivePendingFree;
      }
      segment.active_size += b->size;
      segment.blocks.push_back(block);
      at = b->address + b->size;
    }
    add_free(run_end);
    snapshot.segments.push_back(std::move(segment));
    page = end_page;
  }
}

uint64_t CachingAllocator::LargestFreePlannedRun() const {
  AllocatorSnapshot snapshot;
  AddPlannedSnapshot(snapshot);
  uint64_t largest = 0;
  for (const SegmentSnapshot& segment : snapshot.segments) {
    for (const BlockSnapshot& block : segment.blocks) {
      if (block.state == BlockState::kInactive) largest = std::max(largest, block.size);
    }
  }
  return largest;
}

}  // namespace headroom
