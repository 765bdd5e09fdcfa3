// The caching policy: allocate, free, stream-ordered reuse. The stream
// shards and their budgets are in caching_allocator_shards.cc, statistics
// and snapshots in caching_allocator_stats.cc, growth, release and the
// out-of-memory path in caching_allocator_release.cc, the invariant checks in
// caching_allocator_validate.cc, and the memory sources in sources/.
#include "allocator/caching_allocator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {

namespace {

// HintedShard: the allocator and shard of this thread's last call.
struct ShardHint {
  uint64_t allocator = 0;
  size_t shard = 0;
};
thread_local ShardHint shard_hint;

// Whether the free `block` and its neighbour `n` coalesce.
bool MergesWith(const internal::Block* block, const internal::Block* n) {
  return n != nullptr && n->is_free() && n->stream == block->stream;
}

// Note [Growable blocks]: a block's size, and the unmapped range after it
// that growth would map.
uint64_t GrowableSize(const internal::Block* block) {
  return block->size + (block->next != nullptr && !block->next->mapped ? block->next->size : 0);
}

}  // namespace

// --- Stream shards: the fast path's side (the rest in caching_allocator_shards.cc) ----

CachingAllocator::ExclusiveLock::ExclusiveLock(const CachingAllocator* allocator) : allocator_(allocator) {
  allocator->mu_.Lock();
  for (StreamShard* shard : allocator->Shards()) shard->mu.Lock();
  allocator->AddShardStats();
  allocator->stats_direct_ = true;
}

CachingAllocator::ExclusiveLock::~ExclusiveLock() {
  allocator_->stats_direct_ = allocator_->Shards().size() < 2;
  allocator_->SetShardBudgets();
  for (StreamShard* shard : allocator_->Shards()) shard->mu.Unlock();
  allocator_->mu_.Unlock();
}

CachingAllocator::StreamShard* CachingAllocator::HintedShard() const {
  return shard_hint.allocator == id_ ? shards_[shard_hint.shard].load(std::memory_order_acquire) : nullptr;
}

void CachingAllocator::SetHint(StreamHandle stream) const {
  shard_hint = {.allocator = id_, .shard = ShardIndex(stream)};
}

bool CachingAllocator::AllocationWithinBudget(const StreamShard& shard, const Block* block, uint64_t size,
                                              uint64_t rounded) const {
  if (StatsDirect()) return true;
  // As HandOut will change them: in a segment of one stream the rest of a split has no free neighbour to merge.
  const bool split = ShouldSplit(block, rounded);
  const auto taken = static_cast<int64_t>(split ? rounded : block->size);
  const int64_t counted = block->counted_inactive_split ? 1 : 0;
  internal::ShardStats::Counters most{};
  most[static_cast<size_t>(BlockStat::kAllocation)] = 1;
  most[static_cast<size_t>(BlockStat::kAllocatedBytes)] = taken;
  most[static_cast<size_t>(BlockStat::kRequestedBytes)] = static_cast<int64_t>(size);
  most[static_cast<size_t>(BlockStat::kActive)] = 1;
  most[static_cast<size_t>(BlockStat::kActiveBytes)] = taken;
  most[static_cast<size_t>(BlockStat::kInactiveSplit)] = (split ? 1 : 0) - counted;
  most[static_cast<size_t>(BlockStat::kInactiveSplitBytes)] =
      (split ? static_cast<int64_t>(block->size) - taken : 0) - counted * static_cast<int64_t>(block->size);
  most[static_cast<size_t>(BlockStat::kOversizeAllocations)] =
      static_cast<uint64_t>(taken) >= options_.max_split_size ? 1 : 0;
  return shard.stats.Admits(StatOf(block->pool), most);
}

bool CachingAllocator::FreeWithinBudget(const StreamShard& shard, const Block* block) const {
  if (StatsDirect()) return true;
  // Freeing lowers every counter but the free split blocks: as CacheFreeBlock
  // will change them, the block merges with its free neighbours (counted,
  // being split: the block is beside them) and the result counts if it is
  // still split.
  auto mergeable = [block](const Block* n) { return MergesWith(block, n); };
  int64_t merged_count = 0;
  int64_t merged_bytes = 0;
  const Block* before = block->prev;
  const Block* after = block->next;
  if (mergeable(before)) {
    ++merged_count;
    merged_bytes += static_cast<int64_t>(before->size);
    before = before->prev;
  }
  if (mergeable(after)) {
    ++merged_count;
    merged_bytes += static_cast<int64_t>(after->size);
    after = after->next;
  }
  const bool split = before != nullptr || after != nullptr;
  internal::ShardStats::Counters most{};
  most[static_cast<size_t>(BlockStat::kInactiveSplit)] = (split ? 1 : 0) - merged_count;
  most[static_cast<size_t>(BlockStat::kInactiveSplitBytes)] =
      (split ? static_cast<int64_t>(block->size) + merged_bytes : 0) - merged_bytes;
  return shard.stats.Admits(StatOf(block->pool), most);
}

void CachingAllocator::AfterFastPath(const char* operation) const {
  if constexpr (kExpensiveChecks) {
    ExclusiveLock lock(this);
    CheckInvariantsAfter(operation);
  } else {
    (void)operation;
  }
}

// --- Blocks ------------------------------------------------------------------

CachingAllocator::Block* CachingAllocator::NewBlock(const Block* like) { return TakeSpare(ShardOf(like)); }

CachingAllocator::Block* CachingAllocator::NewBlock(StreamHandle stream) { return TakeSpare(ShardOf(stream)); }

CachingAllocator::Block* CachingAllocator::TakeSpare(StreamShard& shard) {
  std::vector<Block*>& spares = shard.spare_blocks;
  if (spares.empty()) return new Block();
  Block* block = spares.back();
  spares.pop_back();
  *block = Block();
  return block;
}

void CachingAllocator::DeleteBlock(Block* block) {
  block->stream_uses.clear();
  ShardOf(block).spare_blocks.push_back(block);
}

// Keeps inactive_split stats exact: a cached block counts while it is in a
// pool, and whether it counted is remembered, because its neighbours (and so
// is_split()) change only while it is out of the pool.
void CachingAllocator::PoolInsert(Block* block) {
  block->cached_at = lookups_[static_cast<size_t>(block->pool)];
  PoolOf(block).Insert(block);
  CountCached(block);
}

void CachingAllocator::CountCached(Block* block) {
  block->counted_inactive_split = block->is_split();
  if (block->counted_inactive_split) {
    CountStat(block, BlockStat::kInactiveSplit, 1);
    CountStat(block, BlockStat::kInactiveSplitBytes, static_cast<int64_t>(block->size));
  }
}

void CachingAllocator::PoolErase(Block* block) {
  PoolOf(block).Erase(block);
  UncountInactiveSplit(block);
}

void CachingAllocator::UncountInactiveSplit(Block* block) {
  if (block->counted_inactive_split) {
    CountStat(block, BlockStat::kInactiveSplit, -1);
    CountStat(block, BlockStat::kInactiveSplitBytes, -static_cast<int64_t>(block->size));
    block->counted_inactive_split = false;
  }
}

// The history is recorded here, not by a DeviceBackend decorator as the
// memory limit is (LimitingBackend): most entries (alloc, free_requested,
// free_completed, oom) are no device call; the segment entries name the
// stream, which Malloc and Map do not take; an expandable segment's growth is
// one segment_map of all its pages where the device sees a Map per page; and
// a stitched block's segment_map and segment_unmap name the caller's block
// inside the range, not the range the device maps. A decorator's history
// would differ from PyTorch's, which snapshots and memory_viz follow.
void CachingAllocator::Record(TraceAction action, DeviceAddress address, uint64_t size, StreamHandle stream) {
  if (!history_.enabled()) return;  // changes under the exclusive lock only
  internal::SpinLockHolder lock(&history_mu_);
  history_.Add({.action = action,
                .address = address,
                .size = size,
                .stream = stream,
                .time_ns = backend_->NowNanoseconds()});
}

absl::StatusOr<DeviceAddress> CachingAllocator::Allocate(uint64_t size, StreamHandle stream) {
  if (size == 0) return DeviceAddress{0};
  if (size > kMaxRequest) {
    return absl::InvalidArgumentError(absl::StrFormat("allocate: %d bytes is beyond any device", size));
  }
  const uint64_t rounded = RoundSize(size, options_.rounding);
  SetHint(stream);
  // Note [Stream shards]: the fast path. Note [Reusing a step's layout]: not for the sizes it names; Note
  // [Following a layout plan]: not while a plan counts the requests.
  const bool skips_fast_path = ReusesLayout(rounded) || following_plan_.load(std::memory_order_relaxed);
  if (StreamShard* shard = skips_fast_path ? nullptr : FindShard(stream)) {
    DeviceAddress address = 0;
    {
      internal::SpinLockHolder lock(&shard->mu);
      if (Block* block = AllocateCached(*shard, size, rounded, stream)) {
        shard->pointers.Insert(block->address, block);
        address = block->address;
      }
    }
    if (address != 0) {
      AfterFastPath("Allocate");
      return address;
    }
  }
  ExclusiveLock lock(this);
  InvariantCheckOnExit check(this, "Allocate");  // Note [Expensive checks]
  Block* block = nullptr;
  if (following_plan_.load(std::memory_order_relaxed)) {
    HEADROOM_ASSIGN_OR_RETURN(block, planned_.Allocate(size, stream));
    // The request departs from the plan, which ends it.
    if (block == nullptr) following_plan_.store(false, std::memory_order_relaxed);
  }
  if (block == nullptr) {
    HEADROOM_ASSIGN_OR_RETURN(block, AllocateBlock(size, rounded, stream));
  }
  ShardOf(block->stream).pointers.Insert(block->address, block);
  return block->address;
}

CachingAllocator::Block* CachingAllocator::AllocateCached(StreamShard& shard, uint64_t size, uint64_t rounded,
                                                          StreamHandle stream) {
  // Pending frees are polled, in order, by the exclusive path.
  if (!pending_frees_.empty()) return nullptr;
  Block* block = BestFit(shard.Pool(PoolFor(rounded)), stream, rounded);
  if (block == nullptr || !OversizeRulesAccept(block, rounded) || block->segment->mixed_streams ||
      !AllocationWithinBudget(shard, block, size, rounded)) {
    return nullptr;
  }
  PoolErase(block);
  HandOut(block, size, rounded);
  return block;
}

CachingAllocator::Block* CachingAllocator::BestFit(BlockPool& pool, StreamHandle stream, uint64_t rounded) {
  Block* fit = pool.BestFit(stream, rounded);
  if (fit == nullptr || GrowableSize(fit) == fit->size) return fit;
  // Walk on through the blocks of at least `rounded` bytes in (size,
  // address) order while the next one's growable size is smaller: each
  // block passed is taken out of the pool so that BestFit finds its
  // successor, and put back at the end. The walk passes at most
  // kMaxPassed blocks (PyTorch's has no bound; a block passed borders
  // unmapped space, so passing many takes as many holes).
  constexpr size_t kMaxPassed = 16;
  std::array<Block*, kMaxPassed> passed;
  size_t count = 0;
  while (count < kMaxPassed) {
    pool.Erase(fit);
    Block* next = pool.BestFit(stream, rounded);
    if (next == nullptr || GrowableSize(next) >= GrowableSize(fit)) {
      pool.Insert(fit);
      break;
    }
    passed[count++] = fit;
    fit = next;
  }
  for (size_t i = 0; i < count; ++i) pool.Insert(passed[i]);
  return fit;
}

bool CachingAllocator::OversizeRulesAccept(const Block* fit, uint64_t size) const {
  // Oversize blocks are kept whole for oversize requests, and an oversize
  // request does not take a block much larger than itself.
  const uint64_t max_split = options_.max_split_size;
  if (size < max_split && fit->size >= max_split) return false;
  return !(size >= max_split && fit->size >= size + kLargeBuffer);
}

CachingAllocator::Block* CachingAllocator::TakeCachedBlock(PoolKind kind, StreamHandle stream, uint64_t size) {
  Block* block = BestFit(PoolOf(kind, stream), stream, size);
  if (block == nullptr || !OversizeRulesAccept(block, size)) return nullptr;
  PoolErase(block);
  return block;
}

absl::StatusOr<CachingAllocator::Block*> CachingAllocator::AllocateBlock(uint64_t size, uint64_t rounded,
                                                                         StreamHandle stream) {
  if (!pending_frees_.empty()) HEADROOM_RETURN_IF_ERROR(ProcessPendingFrees());
  const PoolKind kind = PoolFor(rounded);
  // Note [Reusing a step's layout]
  std::optional<internal::LayoutMemory::Name> name;
  Block* block = nullptr;
  if (ReusesLayout(rounded)) {
    name = layout_memory_.NameOf(stream, rounded);
    if (std::optional<DeviceAddress> at = layout_memory_.Remembered(*name)) {
      block = TakeCachedRange(kind, stream, *at, rounded);
    }
  }
  if (block == nullptr) block = TakeCachedBlock(kind, stream, rounded);
  if (block == nullptr) {
    HEADROOM_ASSIGN_OR_RETURN(block, AllocateBlockSlow(kind, size, rounded, stream));
  }
  HandOut(block, size, rounded);
  if (name.has_value()) layout_memory_.Place(*name, block->address);
  return block;
}

CachingAllocator::Block* CachingAllocator::TakeCachedRange(PoolKind kind, StreamHandle stream, DeviceAddress address,
                                                           uint64_t size) {
  Block* block = PoolOf(kind, stream).Holding(stream, address, size);
  if (block == nullptr || !OversizeRulesAccept(block, size)) return nullptr;
  PoolErase(block);
  return CarveAt(block, address);
}

CachingAllocator::Block* CachingAllocator::CarveAt(Block* block, DeviceAddress address) {
  if (block->address == address) return block;
  Split(block, address - block->address);  // `block` keeps what lies below; the rest, from `address`, is cached
  PoolInsert(block);
  Block* taken = block->next;
  PoolErase(taken);
  return taken;
}

void CachingAllocator::HandOut(Block* block, uint64_t size, uint64_t rounded) {
  if (ShouldSplit(block, rounded)) Split(block, rounded);
  block->allocated = true;
  block->requested_size = size;
  const int64_t bytes = static_cast<int64_t>(block->size);
  CountStat(block, BlockStat::kAllocation, 1);
  CountStat(block, BlockStat::kAllocatedBytes, bytes);
  CountStat(block, BlockStat::kRequestedBytes, static_cast<int64_t>(size));
  CountStat(block, BlockStat::kActive, 1);
  CountStat(block, BlockStat::kActiveBytes, bytes);
  if (block->size >= options_.max_split_size) CountStat(block, BlockStat::kOversizeAllocations, 1);
  if (StatsDirect()) UpdatePeakTracking();  // on a budget no peak is reached (Note [Peak budgets])
  Record(TraceAction::kAlloc, block->address, block->size, block->stream);
}

// The out-of-line path: no cached block on this stream fits.
absl::StatusOr<CachingAllocator::Block*> CachingAllocator::AllocateBlockSlow(PoolKind kind, uint64_t size,
                                                                             uint64_t rounded,
                                                                             StreamHandle stream) {
  ++lookups_[static_cast<size_t>(kind)];
  if (options_.garbage_collection_threshold > 0.0) HEADROOM_RETURN_IF_ERROR(GarbageCollect());
  if (options_.cross_stream_reuse) {
    HEADROOM_ASSIGN_OR_RETURN(Block * reused, TakeOtherStreamBlock(kind, stream, rounded));
    if (reused != nullptr) return reused;
    // Note [Cross-stream reuse]: a block whose free still waits on other streams, made this stream's wait.
    HEADROOM_ASSIGN_OR_RETURN(const bool adopted, WaitForPendingBlock(kind, stream, rounded));
    if (adopted) {
      if (Block* block = TakeCachedBlock(kind, stream, rounded)) return block;
      HEADROOM_ASSIGN_OR_RETURN(reused, TakeOtherStreamBlock(kind, stream, rounded));
      if (reused != nullptr) return reused;
    }
  }
  absl::StatusOr<Block*> grown = GrowPool(kind, stream, rounded);
  if (grown.ok() || !absl::IsResourceExhausted(grown.status())) return grown;

  // Note [Out of memory]
  ++stats_.num_alloc_retries;
  const uint64_t needed = options_.expandable_segments ? rounded : SegmentSizeFor(rounded);
  HEADROOM_ASSIGN_OR_RETURN(bool released, ReleaseAvailableCache(kind, needed));
  if (released) {
    grown = GrowPool(kind, stream, rounded);
    if (grown.ok() || !absl::IsResourceExhausted(grown.status())) return grown;
  }
  if (!pending_frees_.empty()) {
    HEADROOM_RETURN_IF_ERROR(WaitForPendingFrees());
    if (Block* block = TakeCachedBlock(kind, stream, rounded)) return block;
  }
  HEADROOM_RETURN_IF_ERROR(ReleaseAllCache());
  grown = GrowPool(kind, stream, rounded);
  if (grown.ok() || !absl::IsResourceExhausted(grown.status())) return grown;
  if (options_.stitch_pages) {  // Note [Stitched blocks]
    // A last resort: where it fails, even by a device error, the request is out of memory as without it.
    absl::StatusOr<Block*> stitched = stitched_.Allocate(kind, rounded, stream);
    if (stitched.ok() && *stitched != nullptr) return *stitched;
  }
  return OutOfMemory(size, rounded, stream, grown.status());
}

// Note [Cross-stream reuse]
absl::StatusOr<CachingAllocator::Block*> CachingAllocator::TakeOtherStreamBlock(PoolKind kind, StreamHandle stream,
                                                                                uint64_t size) {
  Block* best = nullptr;
  for (StreamHandle other : CachedStreams(kind)) {
    if (other == stream) continue;
    Block* fit = BestFit(PoolOf(kind, other), other, size);
    if (fit != nullptr && OversizeRulesAccept(fit, size) && (best == nullptr || fit->size < best->size)) best = fit;
  }
  if (best == nullptr) return nullptr;
  HEADROOM_ASSIGN_OR_RETURN(EventHandle event, TakeEvent());
  absl::Status status = backend_->RecordEvent(event, best->stream);
  if (status.ok()) status = backend_->StreamWaitEvent(stream, event);
  free_events_.push_back(event);  // reusable once the wait is enqueued
  if (!status.ok()) return status;
  PoolErase(best);
  best->stream = stream;
  best->segment->mixed_streams = true;
  return best;
}

absl::StatusOr<bool> CachingAllocator::WaitForPendingBlock(PoolKind kind, StreamHandle stream, uint64_t size) {
  Block* best = nullptr;
  for (const PendingFree& pending : pending_frees_) {
    Block* b = pending.block;
    if (b->pool == kind && b->size >= size && !b->segment->stitched && !b->segment->planned &&
        OversizeRulesAccept(b, size) &&
        (best == nullptr || b->size < best->size)) {
      best = b;
    }
  }
  if (best == nullptr) return false;
  // `stream` waits on each event the free waits on; the events return to the pool once the waits are enqueued.
  std::deque<PendingFree> others;
  absl::Status status;
  for (const PendingFree& pending : pending_frees_) {
    if (pending.block != best || !status.ok()) {
      others.push_back(pending);
      continue;
    }
    status = backend_->StreamWaitEvent(stream, pending.event);
    if (!status.ok()) {
      others.push_back(pending);
      continue;
    }
    free_events_.push_back(pending.event);
    --best->pending_events;
  }
  pending_frees_.swap(others);
  if (!status.ok()) return status;
  CompleteFree(best);  // cached on its own stream; the caller takes it from there
  return true;
}

bool CachingAllocator::ShouldSplit(const Block* block, uint64_t size) const {
  const uint64_t remaining = block->size - size;
  if (block->segment->stitched || block->segment->planned) return false;
  if (block->pool == PoolKind::kSmall || block->segment->expandable) return remaining >= kMinBlockSize;
  return size < options_.max_split_size && remaining > kSmallSize;
}

void CachingAllocator::Split(Block* block, uint64_t size) {
  Block* rest = NewBlock(block);
  rest->address = block->address + size;
  rest->size = block->size - size;
  rest->stream = block->stream;
  rest->pool = block->pool;
  rest->segment = block->segment;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  // Usually `rest` has no free neighbour (`block` was coalesced), but after a
  // cross-stream move it may now share a stream with the next block.
  if (Block* next = rest->next; next != nullptr && next->is_free() && next->stream == rest->stream) {
    PoolErase(next);
    DeleteBlock(internal::AbsorbNext(rest));
  }
  PoolInsert(rest);
  block->size = size;
}

CachingAllocator::Block* CachingAllocator::CacheFreeBlock(Block* block) {
  block->allocated = false;
  block->requested_size = 0;
  auto mergeable = [block](const Block* n) { return MergesWith(block, n); };
  if (Block* prev = block->prev; mergeable(prev)) {
    PoolErase(prev);
    DeleteBlock(internal::AbsorbPrev(block));
  }
  if (Block* next = block->next; mergeable(next)) {
    PoolErase(next);
    DeleteBlock(internal::AbsorbNext(block));
  }
  PoolInsert(block);
  return block;
}

void CachingAllocator::CompleteFree(Block* block) {
  // Note [Stitched blocks]: its second mapping goes first; if the device refuses, it stays out of use.
  if (block->segment->stitched && !stitched_.Unmap(block)) {
    block->quarantined = true;
    return;
  }
  CountStat(block, BlockStat::kActive, -1);
  CountStat(block, BlockStat::kActiveBytes, -static_cast<int64_t>(block->size));
  Record(TraceAction::kFreeCompleted, block->address, block->size, block->stream);
  if (block->segment->stitched) {
    stitched_.Drop(block);
  } else if (block->segment->planned) {
    planned_.Release(block);
  } else {
    CacheFreeBlock(block);
  }
}

absl::Status CachingAllocator::FreeAllocatedBlock(Block* block) {
  CountStat(block, BlockStat::kAllocation, -1);
  CountStat(block, BlockStat::kAllocatedBytes, -static_cast<int64_t>(block->size));
  CountStat(block, BlockStat::kRequestedBytes, -static_cast<int64_t>(block->requested_size));
  if (block->size >= options_.max_split_size) CountStat(block, BlockStat::kOversizeAllocations, -1);
  Record(TraceAction::kFreeRequested, block->address, block->size, block->stream);
  block->allocated = false;
  block->requested_size = 0;
  // Note [Stitched blocks]: its range is unmapped once its own stream is done with it too.
  if (block->segment->stitched) block->stream_uses.push_back(block->stream);
  if (block->stream_uses.empty()) {
    CompleteFree(block);
    return absl::OkStatus();
  }
  // Note [Stream-ordered frees]
  std::vector<StreamHandle> uses;
  uses.swap(block->stream_uses);
  absl::Status first_error;
  for (StreamHandle use : uses) {
    absl::StatusOr<EventHandle> event = TakeEvent();
    absl::Status status = event.status();
    if (status.ok()) status = backend_->RecordEvent(*event, use);
    if (status.ok()) {
      pending_frees_.push_back({*event, block});
      ++block->pending_events;
      continue;
    }
    if (event.ok()) free_events_.push_back(*event);
    // No event: wait for the stream on the host instead; correct, only slower.
    if (absl::Status sync = backend_->SynchronizeStream(use); !sync.ok() && first_error.ok()) first_error = sync;
  }
  if (block->pending_events == 0) {
    if (!first_error.ok()) {
      // Neither an event nor a host wait worked: the block cannot be proven
      // idle, so it is quarantined rather than risk handing out memory a
      // kernel may still write.
      block->quarantined = true;
      return absl::Status(first_error.code(),
                          absl::StrFormat("free of 0x%x: cannot order it after the streams that used the block (%s); "
                                          "the block is kept out of use",
                                          block->address, std::string(first_error.message())));
    }
    CompleteFree(block);
  }
  return absl::OkStatus();
}

absl::StatusOr<EventHandle> CachingAllocator::TakeEvent() {
  if (!free_events_.empty()) {
    EventHandle event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  return backend_->CreateEvent();
}

absl::Status CachingAllocator::ProcessPendingFrees() {
  std::deque<PendingFree> waiting;
  absl::Status result;
  while (!pending_frees_.empty()) {
    PendingFree pending = pending_frees_.front();
    pending_frees_.pop_front();
    absl::StatusOr<bool> done = backend_->QueryEvent(pending.event);
    if (!done.ok() || !*done) {
      if (!done.ok() && result.ok()) result = done.status();
      waiting.push_back(pending);
      continue;
    }
    free_events_.push_back(pending.event);
    if (--pending.block->pending_events == 0) CompleteFree(pending.block);
  }
  pending_frees_.swap(waiting);
  return result;
}

absl::Status CachingAllocator::WaitForPendingFrees() {
  ++stats_.num_sync_all_streams;
  for (const PendingFree& pending : pending_frees_) {
    HEADROOM_RETURN_IF_ERROR(backend_->SynchronizeEvent(pending.event));
  }
  return ProcessPendingFrees();
}

absl::Status CachingAllocator::Free(DeviceAddress address, std::optional<uint64_t> expected_size,
                                    std::optional<StreamHandle> freeing_stream) {
  if (address == 0) return absl::OkStatus();
  // Note [Stream shards]: the fast path, in the freeing stream's shard or
  // else this thread's last one, for a block that waits for no other stream.
  if (StreamShard* shard = freeing_stream.has_value() ? FindShard(*freeing_stream) : HintedShard()) {
    bool freed = false;
    {
      internal::SpinLockHolder lock(&shard->mu);
      Block* block = shard->pointers.Find(address);
      if (block != nullptr && block->stream_uses.empty() && !block->segment->mixed_streams &&
          !block->segment->stitched && !block->segment->planned &&
          (!expected_size.has_value() || *expected_size == block->requested_size) &&
          (!freeing_stream.has_value() || *freeing_stream == block->stream) && !ReusesLayout(block->size) &&
          FreeWithinBudget(*shard, block)) {
        shard->pointers.Remove(address);
        freed = FreeAllocatedBlock(block).ok();  // no stream to wait for: it cannot fail
      }
    }
    if (freed) {
      AfterFastPath("Free");
      return absl::OkStatus();
    }
  }
  ExclusiveLock lock(this);
  InvariantCheckOnExit check(this, "Free");  // Note [Expensive checks]
  Block* block = FindAllocated(address);
  if (block == nullptr) return absl::InvalidArgumentError(DescribeBadFree(address));
  if (expected_size.has_value() && *expected_size != block->requested_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "free of 0x%x with size %d, but it was allocated with size %d (not freed)", address, *expected_size,
        block->requested_size));
  }
  ShardOf(block->stream).pointers.Remove(address);
  if (const uint64_t rounded = RoundSize(block->requested_size, options_.rounding);
      ReusesLayout(rounded) && !block->segment->planned) {
    layout_memory_.End(block->stream, rounded);
  }
  SetHint(block->stream);  // a thread that frees what another allocated looks there first next time
  if (freeing_stream.has_value()) AddStreamUse(block, *freeing_stream);
  return FreeAllocatedBlock(block);
}

void CachingAllocator::AddStreamUse(Block* block, StreamHandle stream) {
  if (stream != block->stream &&
      std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
}

std::string CachingAllocator::DescribeBadFree(DeviceAddress address) {
  if (stitched_.Contains(address)) {
    return absl::StrFormat("double free of 0x%x: the stitched block was already freed (and still waits for its "
                           "streams)", address);
  }
  if (planned_.Contains(address)) {
    return absl::StrFormat("free of 0x%x in the layout plan's range, where no planned block starts (a double free?)",
                           address);
  }
  const Segment* segment = classic_.Containing(address);
  if (segment == nullptr) segment = expandable_.Containing(address);
  if (segment != nullptr) {
    for (const Block* b = segment->first; b != nullptr; b = b->next) {
      if (address < b->address || address >= b->address + b->size) continue;
      if (b->address != address) {
        return absl::StrFormat(
            "free of 0x%x, which points inside the block [0x%x, +%d): pass the address Allocate returned", address,
            b->address, b->size);
      }
      return absl::StrFormat("double free of 0x%x: the block was already freed%s", address,
                             b->pending_events > 0 ? " (and still waits for other streams)"
                             : b->quarantined      ? " (and is quarantined: its first free failed)"
                                                   : "");
    }
  }
  return absl::StrFormat("free of 0x%x, which this allocator did not allocate (foreign pointer)", address);
}

absl::Status CachingAllocator::RecordStream(DeviceAddress address, StreamHandle stream) {
  ExclusiveLock lock(this);
  InvariantCheckOnExit check(this, "RecordStream");  // Note [Expensive checks]
  Block* block = FindAllocated(address);
  if (block == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("record_stream on 0x%x, which is not an allocated block", address));
  }
  AddStreamUse(block, stream);
  return absl::OkStatus();
}

absl::StatusOr<BlockInfo> CachingAllocator::Lookup(DeviceAddress address) const {
  // Fields of an allocated block change only while it is out of its shard's
  // table, so that shard's lock is enough (Note [Stream shards]).
  for (const auto& slot : shards_) {
    const StreamShard* shard = slot.load(std::memory_order_acquire);
    if (shard == nullptr) continue;
    internal::SpinLockHolder lock(&shard->mu);
    if (const Block* block = shard->pointers.Find(address)) {
      return BlockInfo{.address = block->address,
                       .size = block->size,
                       .requested_size = block->requested_size,
                       .stream = block->stream};
    }
  }
  return absl::NotFoundError(absl::StrFormat("0x%x is not an allocated block", address));
}

}  // namespace headroom
