// Following a layout plan: requests placed where a plan made from a recorded
// run put them, in an address range of the plan's own (Note [Following a
// layout plan] in planned_range.h).
#include "allocator/sources/planned_range.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom::internal {


Block* PlannedRange::Depart(std::string reason) {
  departure_ = std::move(reason);
  return nullptr;
}

absl::StatusOr<Block*> PlannedRange::Allocate(uint64_t size, StreamHandle stream) {
  const LayoutPlan& plan = *options_.layout_plan;
  const uint64_t n = requests_;
  const PlannedBlock* planned = plan.At(n);
  if (planned == nullptr) {
    return Depart(absl::StrFormat("request %d: the plan ends after %d requests", n, plan.blocks.size()));
  }
  if (segment_ == nullptr) {
    // Without its range the plan cannot be followed; the policy still can serve the job. A range past twice the
    // device (what an expandable segment that moves pages reserves) is no plan for it, and would size the page
    // tables from an absurd offset.
    const uint64_t range_bytes = RoundUp(plan.extent_bytes(), granularity_);
    if (range_bytes / 2 > total_bytes_) {
      return Depart(absl::StrFormat("request %d: the plan's address range of %s is more than twice the device's %s",
                                    n, FormatBytes(range_bytes), FormatBytes(total_bytes_)));
    }
    if (absl::Status reserved = ReserveRange(stream, range_bytes); !reserved.ok()) {
      return Depart(absl::StrFormat("request %d: the plan's address range of %s could not be reserved: %s", n,
                                    FormatBytes(range_bytes), reserved.message()));
    }
  }
  Segment* range = segment_.get();
  if (stream != range->stream) {
    return Depart(absl::StrFormat("request %d is on stream %d; the plan's requests are on stream %d", n,
                                  stream.value, range->stream.value));
  }
  if (RoundUp(size, kMinBlockSize) != planned->size) {
    return Depart(absl::StrFormat("request %d asks for %d bytes; the plan has %d there", n, size, planned->size));
  }
  const DeviceAddress address = range->address + planned->offset;
  const DeviceAddress end = address + planned->size;
  auto after = live_.lower_bound(address);
  const Block* in_use = nullptr;
  if (after != live_.end() && after->first < end) {
    in_use = after->second;
  } else if (after != live_.begin()) {
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

  const auto [first, last] = PagesOf(address, planned->size);
  // Note [Expandable page table]: the tables grow with the pages the plan touches, not with its range.
  if (users_.size() <= last) users_.resize(last + 1, 0);
  absl::Status mapped;
  // A new page or one moved in the range first; then the out-of-memory flush (Note [Out of memory]), which also
  // releases the range's unused pages, those just mapped for this request among them: so all are checked again.
  for (int attempt = 0; attempt < 2; ++attempt) {
    mapped = absl::OkStatus();
    for (uint64_t page = first; page <= last && mapped.ok(); ++page) {
      if (range->PageAt(page).value == 0) mapped = MapPage(page, first, last);
    }
    if (mapped.ok() || !absl::IsResourceExhausted(mapped) || attempt == 1) break;
    ++stats_.num_alloc_retries;
    HEADROOM_RETURN_IF_ERROR(host_->ReleaseAllCache());
  }
  if (!mapped.ok()) {
    if (!absl::IsResourceExhausted(mapped)) return mapped;
    return host_->OutOfMemory(size, planned->size, stream, mapped);
  }

  ++requests_;
  Block* block = host_->NewBlock(stream);
  block->address = address;
  block->size = planned->size;
  block->stream = stream;
  block->pool = PoolKind::kLarge;
  block->segment = range;
  for (uint64_t page = first; page <= last; ++page) ++users_[page];
  live_.emplace(address, block);
  ++stats_.num_planned_allocs;
  host_->HandOut(block, size, planned->size);
  return block;
}

absl::Status PlannedRange::ReserveRange(StreamHandle stream, uint64_t bytes) {
  HEADROOM_ASSIGN_OR_RETURN(DeviceAddress address, backend_->ReserveAddressRange(bytes));
  auto segment = std::make_unique<Segment>();
  segment->address = address;
  segment->size = bytes;
  segment->stream = stream;
  segment->pool = PoolKind::kLarge;
  segment->planned = true;
  segment->shard = host_->ShardFor(stream);
  segment_ = std::move(segment);
  stats_.segment.Increase(StatOf(PoolKind::kLarge), 1);
  return absl::OkStatus();
}

std::pair<uint64_t, uint64_t> PlannedRange::PagesOf(DeviceAddress address, uint64_t size) const {
  const uint64_t offset = address - segment_->address;
  return {offset / granularity_, (offset + size - 1) / granularity_};
}

absl::Status PlannedRange::MapPage(uint64_t page, uint64_t first, uint64_t last) {
  Segment* range = segment_.get();
  absl::StatusOr<PhysicalHandle> handle = CreatePage();
  if (!handle.ok() && absl::IsResourceExhausted(handle.status())) {
    // A page of the range no live block touches, the highest, outside the request's own pages.
    for (uint64_t unused = users_.size(); unused-- > 0;) {
      if (users_[unused] != 0 || range->PageAt(unused).value == 0 || (unused >= first && unused <= last)) {
        continue;
      }
      handle = UnmapPage(unused);
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
    (void)host_->ReleasePage(*handle, PoolKind::kLarge);
    return status;
  }
  if (range->pages.size() <= page) range->pages.resize(page + 1);
  range->pages[page] = *handle;
  range->mapped_bytes += granularity_;
  ++stats_.num_pages_mapped;
  host_->Record(TraceAction::kSegmentMap, address, granularity_, range->stream);
  return absl::OkStatus();
}

absl::StatusOr<PhysicalHandle> PlannedRange::CreatePage() {
  // Past the memory limit the LimitingBackend refuses, as the device would.
  HEADROOM_ASSIGN_OR_RETURN(PhysicalHandle handle, backend_->CreatePhysical(granularity_));
  stats_.reserved_bytes.Increase(StatOf(PoolKind::kLarge), static_cast<int64_t>(granularity_));
  ++stats_.num_device_alloc;
  return handle;
}

absl::StatusOr<PhysicalHandle> PlannedRange::UnmapPage(uint64_t page, bool synchronized) {
  Segment* range = segment_.get();
  // Kernels queued before the frees of the blocks that touched it may still do.
  if (!synchronized) HEADROOM_RETURN_IF_ERROR(backend_->SynchronizeStream(range->stream));
  const DeviceAddress address = range->address + page * granularity_;
  HEADROOM_RETURN_IF_ERROR(backend_->Unmap(address, granularity_));
  const PhysicalHandle handle = range->pages[page];
  range->pages[page] = PhysicalHandle{};
  range->mapped_bytes -= granularity_;
  ++stats_.num_pages_unmapped;
  host_->Record(TraceAction::kSegmentUnmap, address, granularity_, range->stream);
  return handle;
}

void PlannedRange::Release(Block* block) {
  const auto [first, last] = PagesOf(block->address, block->size);
  for (uint64_t page = first; page <= last; ++page) --users_[page];
  live_.erase(block->address);
  host_->DeleteBlock(block);
}

absl::Status PlannedRange::ReleaseUnusedPages() {
  const Segment* range = segment_.get();
  if (range == nullptr || range->mapped_bytes == 0) return absl::OkStatus();
  HEADROOM_RETURN_IF_ERROR(backend_->SynchronizeStream(range->stream));
  absl::Status first_error;
  for (uint64_t page = 0; page < users_.size(); ++page) {
    if (users_[page] != 0 || range->PageAt(page).value == 0) continue;
    HEADROOM_ASSIGN_OR_RETURN(PhysicalHandle handle, UnmapPage(page, /*synchronized=*/true));
    if (absl::Status status = host_->ReleasePage(handle, PoolKind::kLarge); !status.ok() && first_error.ok()) {
      first_error = status;
    }
  }
  return first_error;
}

void PlannedRange::AddToSnapshot(AllocatorSnapshot& snapshot) const {
  const Segment* range = segment_.get();
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
    for (auto it = live_.lower_bound(segment.address); it != live_.end() && it->first < run_end;
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

uint64_t PlannedRange::LargestFreeRun() const {
  if (segment_ == nullptr) return 0;
  AllocatorSnapshot snapshot;
  AddToSnapshot(snapshot);
  uint64_t largest = 0;
  for (const SegmentSnapshot& segment : snapshot.segments) {
    for (const BlockSnapshot& block : segment.blocks) {
      if (block.state == BlockState::kInactive) largest = std::max(largest, block.size);
    }
  }
  return largest;
}

absl::Status PlannedRange::ReleaseIdleRange() {
  const Segment* range = segment_.get();
  if (range == nullptr || !live_.empty() || range->mapped_bytes != 0) return absl::OkStatus();
  HEADROOM_RETURN_IF_ERROR(backend_->ReleaseAddressRange(range->address, range->size));
  stats_.segment.Decrease(StatOf(PoolKind::kLarge), 1);
  segment_.reset();
  users_.clear();
  return absl::OkStatus();
}

bool PlannedRange::Contains(DeviceAddress address) const {
  const Segment* range = segment_.get();
  return range != nullptr && address >= range->address && address < range->address + range->size;
}

// The live planned blocks lie apart in the plan's range, in mapped pages,
// which they use as `users_` says.
absl::Status PlannedRange::Validate(Recount& recount) const {
  const Segment* range = segment_.get();
  if (range == nullptr) {
    if (!live_.empty()) return HEADROOM_INVARIANT_ERROR("layout plan: live blocks but no range");
    return absl::OkStatus();
  }
  recount.CountSegment(kLargePoolStat, range->mapped_bytes);
  // Note [Expandable page table]: a mapped page was touched, so the page table ends within the users'.
  if (!range->planned || range->pages.size() > users_.size() || users_.size() > range->size / granularity_) {
    return HEADROOM_INVARIANT_ERROR("layout plan: range 0x%x of %d bytes, %d pages, %d page users", range->address,
                                    range->size, range->pages.size(), users_.size());
  }
  std::vector<uint32_t> users(users_.size(), 0);
  DeviceAddress end = range->address;
  for (const auto& [address, b] : live_) {
    if (b->address != address || b->segment != range || b->prev != nullptr || b->next != nullptr ||
        b->pool != PoolKind::kLarge || b->stream != range->stream) {
      return HEADROOM_INVARIANT_ERROR("planned block 0x%x: not a block of the plan's range filed under its address",
                                      address);
    }
    if (!b->is_active()) return HEADROOM_INVARIANT_ERROR("planned block 0x%x: neither allocated nor pending", address);
    if (address < end || b->size == 0 || b->size > range->address + range->size - address) {
      return HEADROOM_INVARIANT_ERROR("planned block 0x%x: overlaps the one below it or leaves the range", address);
    }
    end = address + b->size;
    const auto [first, last] = PagesOf(b->address, b->size);
    for (uint64_t page = first; page <= last; ++page) {
      if (range->PageAt(page).value == 0) {
        return HEADROOM_INVARIANT_ERROR("planned block 0x%x: page %d is not mapped", address, page);
      }
      ++users[page];
    }
    recount.CountActive(*b, kLargePoolStat);
  }
  if (users != users_) return HEADROOM_INVARIANT_ERROR("layout plan: page users differ from the live blocks");
  uint64_t mapped = 0;
  for (PhysicalHandle page : range->pages) mapped += page.value != 0 ? 1 : 0;
  if (mapped * granularity_ != range->mapped_bytes) {
    return HEADROOM_INVARIANT_ERROR("layout plan: %d pages mapped but mapped_bytes %d", mapped, range->mapped_bytes);
  }
  return absl::OkStatus();
}

void PlannedRange::Teardown() {
  if (const Segment* range = segment_.get()) {
    ReleaseMappedPages(*backend_, *range, granularity_);
    for (auto& [address, block] : live_) delete block;
  }
}

}  // namespace headroom::internal
