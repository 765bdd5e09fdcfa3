// A caching device-memory allocator: the policy of PyTorch's CUDA caching
// allocator (rounding, small/large pools, best-fit splitting, coalescing,
// max_split_size, expandable segments, stream-ordered reuse) over an injected
// DeviceBackend, so the same code serves a real GPU (CudaBackend) and the
// simulated one used by tests and `headroom replay`.
//
//   HEADROOM_ASSIGN_OR_RETURN(auto backend, SimulatedBackend::Create({.capacity_bytes = 80 * kGiB}));
//   HEADROOM_ASSIGN_OR_RETURN(auto allocator,
//                             CachingAllocator::Create(backend.get(), {.expandable_segments = true}));
//   HEADROOM_ASSIGN_OR_RETURN(DeviceAddress p, allocator->Allocate(4 * kMiB, stream));
//   HEADROOM_RETURN_IF_ERROR(allocator->Free(p));   // cached for `stream`
//   MemoryStats stats = allocator->GetStats();
//
// The backend is not owned and must outlive the allocator. All methods are
// thread-safe, and threads on different streams allocate and free cached
// blocks at once (Note [Stream shards]). Validate() checks every invariant
// of block.h and the stats;
// the stress tests call it after each operation, and builds with
// HEADROOM_EXPENSIVE_CHECKS run it inside every operation (Note [Expensive
// checks]).
//
// Where memory comes from when no cached block serves a request is a memory
// source, each a type of its own with its state, its validator and its Notes
// (allocator/sources/): classic segments (one Malloc each), expandable
// segments (Note [Expandable segments]), stitched ranges (Note [Stitched
// blocks]) and the planned range of a layout plan (Note [Following a layout
// plan]). The allocator composes them: it keeps the caching policy, the
// free-block pools, the statistics, the stream shards and the history, and
// the sources reach these through one interface, internal::SourceHost
// (sources/memory_source.h), which it implements. The memory limit
// (memory_fraction, hard_limit_bytes) is a DeviceBackend decorator,
// LimitingBackend (limiting_backend.h), between the allocator and the device.
//
// Note [Expensive checks]
// With the CMake option HEADROOM_EXPENSIVE_CHECKS (a compile definition of
// the allocator library), every public operation that can change the
// allocator (Allocate, Free, RecordStream, EmptyCache, SetMemoryFraction,
// ResetPeakStats, ResetAccumulatedStats, SetHistoryCapacity) ends, still
// under the lock and on its error paths too, by running every validator
// (caching_allocator_validate.cc; a call served by a shard's fast path takes
// the exclusive lock afterwards to do so); a broken invariant prints the
// validator's message and aborts: it is a bug in the allocator, not an input
// to report. Each check walks every block, so this is for tests (CI runs the
// stress tests under it), never for production. Read-only calls (GetStats,
// Lookup, TakeSnapshot) change nothing and are not checked.
//
// Note [Stream-ordered frees]
// A block belongs to the stream it was allocated on. Work on one stream runs
// in order, so a block freed by the host can be handed to the next request on
// the same stream at once: the new user's kernels queue behind the old ones.
// If other streams used the block (RecordStream), an event is recorded on each
// of them at free time and the block is cached only when all have completed
// (polled without blocking at each Allocate). Events come from a pool.
//
// Note [Cross-stream reuse]
// Off by default (PyTorch never moves blocks between streams). With
// `cross_stream_reuse`, a request on stream S that finds no block cached for S
// may take a cached block of stream T before asking the device for more: an
// event is recorded on T and S is made to wait on it (StreamWaitEvent). The
// host never blocks; the cost is a device-side dependency from S on T's work
// queued so far. The block then belongs to S; it is not coalesced with
// neighbours of other streams. Failing that, it may take a block whose free
// still waits for the streams that used it (RecordStream): S is made to wait
// on those events instead, the free completes at once, and the block moves
// to S as above; only then does the pool grow.
//
// Note [Out of memory]
// When the device refuses a segment the allocator, in order: releases cached
// whole segments of the pool (the smallest one large enough, else largest
// first) and retries; then waits for all pending frees, releases every cached
// segment and unmaps every free expandable page, and retries once more
// (num_alloc_retries). Only then is kResourceExhausted returned, stating the
// request, capacity, device free, allocated and reserved-but-unallocated
// bytes and which option would help. A limit set by memory_fraction or
// hard_limit_bytes counts as the device refusing.
//
// Note [Unreleased pages]
// A physical page is released after it is unmapped; if the device refuses,
// dropping the handle would leak the memory for the life of the process.
// Such pages are kept, still counted in reserved_bytes (device memory this
// allocator holds), and released again at the next EmptyCache or
// out-of-memory flush and at destruction.
//
// Note [One pool]
// With AllocatorOptions::unified_pool, small requests are served from the
// large pool's expandable segment, in its pages, instead of a small pool of
// their own: memory a large block left free serves small blocks at once,
// without moving pages, and the two pools no longer each keep their own
// high-water mark. PyTorch keeps them apart so that long-lived small blocks
// do not split 20 MiB segments; with 2 MiB pages a small block pins at most
// one page of a free run. On the recorded PyTorch runs (bench/traces) one
// pool reserves less than two, with or without moving pages, and settles
// into steps with no page moves where two pools at the same memory do not.

// Note [Reusing a step's layout]
// Best fit places a block by the free blocks there are at that moment, and in
// a training loop they differ a little from step to step (a page moved, a
// small block placed elsewhere). So a step's large blocks can land somewhere
// else every step, and the free runs between them change shape with them: a
// recorded GPU LSTM, whose steps allocate cuDNN buffers of 64 to 128 MiB in
// the same order every step, moved about 57 pages a step without end. With
// AllocatorOptions::reuse_layout_min_bytes, a request of at least that size
// gets a name (internal::LayoutMemory: its stream, its rounded size and its
// count among the blocks of that size allocated since none was live) and
// goes first where the request of that name went last time, if that range
// lies in one cached free block of the stream (carved out of it); else best
// fit as before. A step frees its large blocks by its end, so the names
// repeat from step to step: once a step finds the ranges of all its large
// blocks free, the next identical step places them the same way and needs no
// new page. The address is a hint only, checked against the pool. Requests
// this large, and their frees, take the exclusive lock, where names are
// counted; a step makes few of them.
//   What it does not promise: a loop whose misses displace other named
// blocks can still drift (random loops in bench/RESULTS.md: 5 of 40 keep
// moving pages, 11 of 40 by best fit alone; 2 and 14 before Note
// [Page-aligned growth], 5 and 7 before Note [Growable blocks]). Small
// blocks keep best fit: naming requests from 4 MiB up cost a larger
// smallest device on two of the recorded runs, and any size from 6 MiB to
// 64 MiB gave the figures of 8.
// Naming by the sizes named just before as well, which tells apart blocks
// of one size never live together, settled the LSTM with 8 MiB but not with
// 6, 16 or 64 MiB.
//
// Note [Growable blocks]
// In an expandable segment, a free block that unmapped address space follows
// can grow: a request that no cached block fits maps pages right behind it.
// PyTorch's best fit (get_free_block in c10/cuda/CUDACachingAllocator.cpp,
// with expandable segments) counts such a block by the size it can grow to,
// its own plus the unmapped range after it: from the best fit by size it
// walks on, in (size, address) order, while the next block's growable size
// is smaller. So the block at the end of the mapped pages is taken only when
// no other block fits, the wilderness preservation of dlmalloc-style
// allocators (Wilson, Johnstone, Neely and Boles, "Dynamic Storage
// Allocation: A Survey and Critical Review", 1995). Expandable segments here
// do the same, for every policy. Without it, replaying two H100 runs that
// PyTorch ran with expandable_segments:True reserved 264 and 782 MiB where
// PyTorch reserved 284 and 842 (bench/traces/expandable); with it, the
// replay reserves what PyTorch did, to the byte (recorded_runs_test). It is
// also what settled a recorded LoRA run under Headroom's policy: without it
// best fit put a step's small blocks into the range the segment had just
// grown by for two 16 MiB blocks, which then mapped 8 pages over the next
// two steps (bench/RESULTS.md). The walk takes each block it passes out of
// the pool to find the next, and passes at most 16.
//
// Note [Stream shards]
// PyTorch's allocator serializes every call on one lock per device, so two
// threads allocating on two streams take turns, and each call also writes
// the lock's and the statistics' cache lines, which then bounce between the
// cores (under one lock, two threads on two streams made about half of one
// thread's calls per second in bench/allocator_bench.cc). Here the state a
// call on a cached block touches is split by stream into shards
// (stream_shard.h), each with its own lock: the stream's cached blocks, its
// allocated blocks by address (for Free), the statistics its calls changed,
// spare Block objects. A Block's stream picks
// its shard (a hash of the stream into 64 slots; streams that collide share
// one, which is correct, only slower).
//   The fast path holds its shard's lock alone: an Allocate that a cached
// block of its own stream serves, and a Free of a block no other stream used
// (freeing_stream names the shard to look in; else the shard this thread
// last used, and failing that every shard under the exclusive lock). All
// else takes the exclusive lock, mu_ and then every shard's lock, and runs
// as with one lock: growing, releasing, the out-of-memory path, events,
// cross-stream moves, statistics, snapshots. So does a call while frees wait
// on events (they are polled in order), and a call on a segment that holds
// blocks of several streams (Segment::mixed_streams: their neighbours
// belong to another shard). Statistics stay exact, peaks included, by
// budgets (shard_stats.h, Note [Peak budgets]). A shard's lock is a spin
// lock (critical sections of a hundred nanoseconds); the fast path never
// takes another lock while it holds one (but the history's, last), so the
// two levels cannot deadlock.
#ifndef HEADROOM_ALLOCATOR_CACHING_ALLOCATOR_H_
#define HEADROOM_ALLOCATOR_CACHING_ALLOCATOR_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/allocator_options.h"
#include "allocator/annotated_mutex.h"
#include "allocator/block.h"
#include "allocator/block_pool.h"
#include "allocator/device_backend.h"
#include "allocator/history.h"
#include "allocator/layout_memory.h"
#include "allocator/limiting_backend.h"
#include "allocator/memory_stats.h"
#include "allocator/pool_stats.h"
#include "allocator/snapshot.h"
#include "allocator/shard_stats.h"
#include "allocator/sources/classic_segments.h"
#include "allocator/sources/expandable_segments.h"
#include "allocator/sources/memory_source.h"
#include "allocator/sources/planned_range.h"
#include "allocator/sources/stitched_ranges.h"
#include "allocator/stream_shard.h"

namespace headroom {

// What Lookup() reports about an allocated pointer.
struct BlockInfo {
  DeviceAddress address = 0;
  uint64_t size = 0;            // after rounding
  uint64_t requested_size = 0;  // as asked
  StreamHandle stream;
};

// Final, so that its own calls of the SourceHost methods are direct calls.
class CachingAllocator final : private internal::SourceHost {
 public:
  // Requests above this are rejected as InvalidArgument before rounding.
  static constexpr uint64_t kMaxRequest = uint64_t{1} << 62;

#ifdef HEADROOM_EXPENSIVE_CHECKS
  static constexpr bool kExpensiveChecks = true;
#else
  static constexpr bool kExpensiveChecks = false;
#endif

  static absl::StatusOr<std::unique_ptr<CachingAllocator>> Create(DeviceBackend* backend,
                                                                  AllocatorOptions options);
  // Returns all device memory it holds, including blocks still allocated.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // 0 bytes yields address 0 (which Free accepts).
  absl::StatusOr<DeviceAddress> Allocate(uint64_t size, StreamHandle stream = kDefaultStream);
  // `expected_size`, when given, must equal the size passed to Allocate.
  // `freeing_stream`, when given and not the block's stream, used the block:
  // as RecordStream(address, freeing_stream) followed by the free.
  absl::Status Free(DeviceAddress address, std::optional<uint64_t> expected_size = std::nullopt,
                    std::optional<StreamHandle> freeing_stream = std::nullopt);
  // `stream` used the block: its free waits for the work queued on `stream`.
  absl::Status RecordStream(DeviceAddress address, StreamHandle stream);
  absl::StatusOr<BlockInfo> Lookup(DeviceAddress address) const;

  // Returns every cached segment (and free expandable page) to the device.
  absl::Status EmptyCache();
  absl::Status SetMemoryFraction(double fraction);
  void ResetPeakStats();
  void ResetAccumulatedStats();
  // 0 turns recording off and drops the recorded history.
  void SetHistoryCapacity(size_t entries);

  MemoryStats GetStats() const;
  // reserved_bytes.all.peak alone: O(1), unlike GetStats.
  int64_t PeakReservedBytes() const;
  AllocatorSnapshot TakeSnapshot() const;
  // InternalError naming the first broken invariant.
  absl::Status Validate() const;
  // Note [Following a layout plan]: why the job left its plan, at which
  // request; empty while it follows one, or has none.
  std::string PlanDeparture() const;

  const AllocatorOptions& options() const { return options_; }
  DeviceBackend& backend() const { return *device_; }
  // The reservation limit in force (memory_fraction, hard_limit_bytes).
  uint64_t AllowedBytes() const { return limits_.AllowedBytes(); }

 private:
  using Block = internal::Block;
  using Segment = internal::Segment;
  using PoolKind = internal::PoolKind;
  using BlockPool = internal::BlockPool;
  using StreamShard = internal::StreamShard;
  using BlockStat = internal::BlockStat;

  CachingAllocator(DeviceBackend* backend, AllocatorOptions options);
  // What each memory source is built with: this allocator as its SourceHost.
  internal::SourceContext MakeSourceContext();

  // --- Stream shards (Note [Stream shards]) ---
  static constexpr size_t kShardCount = 64;
  static size_t ShardIndex(StreamHandle stream) {
    return static_cast<size_t>((stream.value * 0x9E3779B97F4A7C15ull) >> 58);
  }
  // The shard of `stream`, or nullptr before its first exclusive call.
  StreamShard* FindShard(StreamHandle stream) const {
    return shards_[ShardIndex(stream)].load(std::memory_order_acquire);
  }
  // The shard of `stream`, created (and locked, as the exclusive lock holds
  // every shard) if new. Exclusive lock, or the fast path of a shard that exists.
  StreamShard& ShardOf(StreamHandle stream) const {
    StreamShard* shard = FindShard(stream);
    return shard != nullptr ? *shard : NewShard(stream);
  }
  StreamShard& NewShard(StreamHandle stream) const;
  // The shard of `block`'s stream: its segment's, unless blocks of the
  // segment moved to other streams.
  StreamShard& ShardOf(const Block* block) const {
    return block->segment->mixed_streams ? ShardOf(block->stream) : *block->segment->shard;
  }
  // Every shard created so far, in the order they were. mu_ held.
  const std::vector<StreamShard*>& Shards() const { return shard_list_; }
  // The shard this thread last allocated or freed in, if any: where its
  // next free is looked up first.
  StreamShard* HintedShard() const;
  void SetHint(StreamHandle stream) const;
  BlockPool& PoolOf(PoolKind kind, StreamHandle stream) { return ShardOf(stream).Pool(kind); }
  BlockPool& PoolOf(const Block* block) { return ShardOf(block).Pool(block->pool); }
  const BlockPool& PoolOf(PoolKind kind, StreamHandle stream) const { return ShardOf(stream).Pool(kind); }
  // Every cached block of `kind` in every shard, by (stream, size, address),
  // as if one pool held them all. Exclusive lock.
  void ForEachCached(PoolKind kind, absl::FunctionRef<void(Block*)> fn) const;
  // The streams with cached blocks of `kind`, ascending. Exclusive lock.
  std::vector<StreamHandle> CachedStreams(PoolKind kind) const;
  // The largest cached block, or free run of the planned range's mapped pages.
  uint64_t LargestCachedSize() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The allocated block at `address` in any shard, or nullptr. Exclusive lock.
  Block* FindAllocated(DeviceAddress address) const;
  // Note [Peak budgets]: adds every shard's statistics to stats_, and
  // divides the room below the peaks among the shards again. Exclusive lock.
  void AddShardStats() const;
  void SetShardBudgets() const;
  // Whether statistics go straight to stats_: under the exclusive lock, or
  // in the only shard, whose fast path then runs alone.
  bool StatsDirect() const { return stats_direct_; }
  // A change of a counter of `block`'s pool: into stats_ if StatsDirect(),
  // else into its shard's sums (Note [Peak budgets]). Inline: with a
  // constant `stat` it is one field's update.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void CountStat(const Block* block, BlockStat stat, int64_t amount) {
    if (StatsDirect()) {
      stats_.Change(stat, StatOf(block->pool), amount);
    } else {  // the fast path touches no segment with blocks of other streams
      block->segment->shard->stats.Add(stat, StatOf(block->pool), amount);
    }
  }

  // mu_, then every shard's lock; adds up the shards' statistics, so that
  // stats_ is current while it is held, and shares out budgets again when
  // it ends (Note [Peak budgets]).
  class ABSL_SCOPED_LOCKABLE ExclusiveLock {
   public:
    explicit ExclusiveLock(const CachingAllocator* allocator) ABSL_EXCLUSIVE_LOCK_FUNCTION(allocator->mu_);
    ~ExclusiveLock() ABSL_UNLOCK_FUNCTION();
    ExclusiveLock(const ExclusiveLock&) = delete;
    ExclusiveLock& operator=(const ExclusiveLock&) = delete;

   private:
    const CachingAllocator* const allocator_;
  };
  // Ends a fast-path call: validates in expensive-check builds (Note
  // [Expensive checks]).
  void AfterFastPath(const char* operation) const;
  // Whether allocating `rounded` bytes (`size` asked) from the cached
  // `block`, or freeing the allocated `block`, keeps its shard within its
  // budget (Note [Peak budgets]): the most the call can raise each counter,
  // worked out from the block before the call.
  bool AllocationWithinBudget(const StreamShard& shard, const Block* block, uint64_t size, uint64_t rounded) const;
  bool FreeWithinBudget(const StreamShard& shard, const Block* block) const;
  // Every classic and expandable segment, by address (snapshots, teardown, validation).
  std::vector<Segment*> SegmentsByAddress() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // max_split_size as PyTorch reports it: 0 when unlimited.
  uint64_t ReportedMaxSplitSize() const {
    return options_.max_split_size == kUnlimitedSplitSize ? 0 : options_.max_split_size;
  }
  static StatIndex StatOf(PoolKind kind) { return internal::StatOf(kind); }


  // --- Blocks (caching_allocator.cc) ---
  // A Block from the spares of the shard of `like`'s stream.
  Block* NewBlock(const Block* like) override;
  Block* NewBlock(StreamHandle stream) override;
  static Block* TakeSpare(StreamShard& shard);
  void DeleteBlock(Block* block) override;
  StreamShard* ShardFor(StreamHandle stream) override { return &ShardOf(stream); }
  void PoolInsert(Block* block) override;
  void PoolErase(Block* block) override;
  void CountCached(Block* block);
  void UncountInactiveSplit(Block* block);
  PoolKind PoolFor(uint64_t rounded) const {
    return IsSmallRequest(rounded) && !options_.unified_pool ? PoolKind::kSmall : PoolKind::kLarge;
  }
  // The fast path: a cached block of `stream`'s own shard, handed out, or
  // nullptr when the call needs the exclusive lock. Shard lock held.
  Block* AllocateCached(StreamShard& shard, uint64_t size, uint64_t rounded, StreamHandle stream);
  // BlockPool::BestFit, but in an expandable segment past a free block that
  // growth would extend while the next block can grow less (Note [Growable
  // blocks]). Under the lock of `pool`'s shard.
  Block* BestFit(BlockPool& pool, StreamHandle stream, uint64_t rounded);
  // Splits off what `block` does not need and marks it allocated for `size`.
  // A stitched block (Note [Stitched blocks]) is exactly `rounded`: not split.
  void HandOut(Block* block, uint64_t size, uint64_t rounded) override;
  absl::StatusOr<Block*> AllocateBlock(uint64_t size, uint64_t rounded, StreamHandle stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Block*> AllocateBlockSlow(PoolKind kind, uint64_t size, uint64_t rounded, StreamHandle stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The cached block of `stream` that BestFit gives and the oversize rules
  // accept, removed from its pool; nullptr if there is none.
  Block* TakeCachedBlock(PoolKind kind, StreamHandle stream, uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Note [Reusing a step's layout]: whether requests of `rounded` bytes are
  // named and placed where they went last time (under the exclusive lock).
  bool ReusesLayout(uint64_t rounded) const {
    return options_.reuse_layout_min_bytes != 0 && rounded >= options_.reuse_layout_min_bytes;
  }
  // The cached block of `stream` that holds [address, address + size),
  // carved out and removed from its pool; nullptr if there is none.
  Block* TakeCachedRange(PoolKind kind, StreamHandle stream, DeviceAddress address, uint64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The part of free `block` (out of its pool) from `address` on, which it
  // holds; what lies below is cached as a block of its own.
  Block* CarveAt(Block* block, DeviceAddress address) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Block*> TakeOtherStreamBlock(PoolKind kind, StreamHandle stream, uint64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Note [Cross-stream reuse]: completes the free of the smallest pending
  // block of `kind` that holds `size` by making `stream` wait on its events;
  // false when none does.
  absl::StatusOr<bool> WaitForPendingBlock(PoolKind kind, StreamHandle stream, uint64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a best fit may serve `size` under the max_split_size rules: an
  // oversize block serves only oversize requests, and none much smaller than
  // itself. The one statement of the rule; every path that takes a cached
  // block (own stream, other stream, after an OOM flush) asks it.
  bool OversizeRulesAccept(const Block* fit, uint64_t size) const;
  bool ShouldSplit(const Block* block, uint64_t size) const;
  void Split(Block* block, uint64_t size) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* CacheFreeBlock(Block* block) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A block no stream uses any more becomes inactive and is cached.
  void CompleteFree(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FreeAllocatedBlock(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `stream`, if not the block's own, used the block (Note [Stream-ordered frees]).
  void AddStreamUse(Block* block, StreamHandle stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ProcessPendingFrees() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WaitForPendingFrees() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<EventHandle> TakeEvent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeBadFree(DeviceAddress address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Record(TraceAction action, DeviceAddress address, uint64_t size, StreamHandle stream) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Getting memory and giving it back (caching_allocator_release.cc) ---
  // A new segment (classic) or pages (expandable) for a request no cached
  // block serves; the device refusing (or a limit) is kResourceExhausted.
  absl::StatusOr<Block*> GrowPool(PoolKind kind, StreamHandle stream, uint64_t rounded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases cached whole segments (and free expandable pages) until at least
  // `bytes` were released; false if it could not.
  absl::StatusOr<bool> ReleaseAvailableCache(PoolKind kind, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReleaseAllCache() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status GarbageCollect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OutOfMemory(uint64_t size, uint64_t rounded, StreamHandle stream, const absl::Status& cause) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdatePeakTracking() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases an unmapped physical page counted in reserved_bytes; one the
  // device refuses is kept for a retry (Note [Unreleased pages]).
  absl::Status ReleasePage(PhysicalHandle handle, PoolKind pool) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RetryUnreleasedPages() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t AllocatedHighWater() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return allocated_high_water_; }

  // --- Validation (caching_allocator_validate.cc), one validator per structure ---
  using Recount = internal::Recount;  // statistics recomputed from the blocks
  absl::Status ValidateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The blocks tile the segment, with consistent links, states, pools and
  // coalescing; adds them to `recount`.
  absl::Status ValidateSegmentTiling(const Segment& segment, Recount& recount) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each shard's pools' bins, bitmap and trees, and that they hold the free
  // blocks of the shard's streams.
  absl::Status ValidatePools(size_t free_blocks) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each shard's table entry names an allocated block of its streams at its
  // address; one entry per allocated block.
  absl::Status ValidatePointerTables(int64_t allocated_blocks) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateStatistics(const Recount& recount) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Note [Expensive checks]: aborts on a broken invariant; a no-op in other builds.
  void CheckInvariantsAfter(const char* operation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Declared right after the lock in each public operation, so that it runs
  // CheckInvariantsAfter under the lock on every return path.
  class InvariantCheckOnExit {
   public:
    InvariantCheckOnExit(const CachingAllocator* allocator, const char* operation)
        : allocator_(allocator), operation_(operation) {}
    InvariantCheckOnExit(const InvariantCheckOnExit&) = delete;
    InvariantCheckOnExit& operator=(const InvariantCheckOnExit&) = delete;
    ~InvariantCheckOnExit() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if constexpr (kExpensiveChecks) allocator_->CheckInvariantsAfter(operation_);
    }

   private:
    const CachingAllocator* allocator_;
    const char* operation_;
  };

  DeviceBackend* const device_;  // the caller's
  // Over device_: refuses memory past memory_fraction and hard_limit_bytes
  // (Note [Out of memory]: a limit counts as the device refusing).
  LimitingBackend limits_;
  // &limits_: the allocator and its sources call the device through it.
  DeviceBackend* const backend_;
  const AllocatorOptions options_;
  const uint64_t granularity_;
  const uint64_t total_bytes_;

  // Tells this allocator's hints from another's (HintedShard).
  const uint64_t id_;

  // Note [Stream shards]: mu_ alone guards what only exclusive calls touch;
  // the exclusive lock holds it and every shard's lock.
  mutable internal::Mutex mu_;
  mutable std::array<std::atomic<StreamShard*>, kShardCount> shards_{};  // each set once, under mu_
  mutable std::vector<StreamShard*> shard_list_ ABSL_GUARDED_BY(mu_);    // the same, owned
  // StatsDirect(): under the exclusive lock, or with one shard. Changes
  // under the exclusive lock only.
  mutable bool stats_direct_ = true;
  // Misses per pool, so that ages of cached blocks can be compared (garbage
  // collection frees the oldest first); read by the fast path.
  std::array<uint64_t, 2> lookups_{};
  internal::LayoutMemory layout_memory_ ABSL_GUARDED_BY(mu_);  // Note [Reusing a step's layout]
  // Whether requests go to the plan (Note [Following a layout plan]); read
  // by the fast path, which they skip. Cleared when the plan departs.
  std::atomic<bool> following_plan_{false};
  struct PendingFree {
    EventHandle event;
    Block* block;
  };
  std::deque<PendingFree> pending_frees_ ABSL_GUARDED_BY(mu_);
  std::vector<EventHandle> free_events_ ABSL_GUARDED_BY(mu_);
  struct UnreleasedPage {
    PhysicalHandle handle;
    PoolKind pool;
  };
  std::vector<UnreleasedPage> unreleased_pages_ ABSL_GUARDED_BY(mu_);
  // Current while the exclusive lock is held (it applies the shards' logs,
  // which const calls do too: hence mutable).
  mutable internal::PoolStats stats_ ABSL_GUARDED_BY(mu_);
  // The most bytes ever allocated at once, which ResetPeakStats leaves
  // alone: a loop that resets the peak every step must not make pages move
  // (move_threshold's bound, Note [Moving free pages]).
  mutable int64_t allocated_high_water_ ABSL_GUARDED_BY(mu_) = 0;
  // Fast paths on different shards record at once.
  mutable internal::SpinLock history_mu_;
  HistoryRing history_ ABSL_GUARDED_BY(history_mu_);

  // The memory sources (allocator/sources/), built over the members above;
  // each call into one holds the exclusive lock.
  internal::ClassicSegments classic_ ABSL_GUARDED_BY(mu_);
  internal::ExpandableSegments expandable_ ABSL_GUARDED_BY(mu_);
  internal::StitchedRanges stitched_ ABSL_GUARDED_BY(mu_);  // pieces of expandable_'s segments
  internal::PlannedRange planned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_CACHING_ALLOCATOR_H_
