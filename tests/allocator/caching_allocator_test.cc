#include "allocator/caching_allocator.h"

#include "common/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/allocator/allocator_test_util.h"
#include "tests/allocator/memory_viz_model.h"

namespace headroom {
namespace {

using ::headroom::testing::MakeAllocator;
using ::testing::HasSubstr;

int64_t Reserved(const MemoryStats& s) { return s.reserved_bytes[kAllPools].current; }
int64_t Allocated(const MemoryStats& s) { return s.allocated_bytes[kAllPools].current; }

TEST(CachingAllocator, RejectsBadOptions) {
  auto device = *SimulatedBackend::Create({});
  EXPECT_FALSE(CachingAllocator::Create(device.get(), {.memory_fraction = 0}).ok());
  EXPECT_FALSE(CachingAllocator::Create(device.get(), {.max_split_size = 4 * kMiB}).ok());
  EXPECT_FALSE(CachingAllocator::Create(device.get(), {.garbage_collection_threshold = 1.5}).ok());
  EXPECT_FALSE(CachingAllocator::Create(device.get(), {.rounding = {.power2_divisions = 3}}).ok());
  auto small_names = CachingAllocator::Create(device.get(), {.reuse_layout_min_bytes = 2 * kMiB});
  EXPECT_EQ(small_names.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small_names.status().message(), HasSubstr("reuse_layout_min_bytes 2.00 MiB"));
  auto align_fixed = CachingAllocator::Create(device.get(), {.align_growth = true});
  EXPECT_EQ(align_fixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(align_fixed.status().message(), HasSubstr("align_growth aligns the growth of expandable segments"));
  auto stitch_fixed = CachingAllocator::Create(device.get(), {.stitch_pages = true});
  EXPECT_EQ(stitch_fixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stitch_fixed.status().message(), HasSubstr("stitch_pages maps pages of expandable segments again"));
  auto no_vmm = *SimulatedBackend::Create({.supports_virtual_memory = false});
  auto r = CachingAllocator::Create(no_vmm.get(), {.expandable_segments = true});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CachingAllocator, RoundsAndReusesOnTheSameStream) {
  auto a = MakeAllocator({});
  DeviceAddress p = *a->Allocate(1000);
  EXPECT_EQ(a->Lookup(p)->size, 1024u);
  EXPECT_EQ(a->Lookup(p)->requested_size, 1000u);
  ASSERT_TRUE(a->Free(p).ok());
  DeviceAddress q = *a->Allocate(900);
  EXPECT_EQ(p, q);
  EXPECT_EQ(a.device->CallCount(BackendCall::kMalloc), 1u);
  MemoryStats s = a->GetStats();
  EXPECT_EQ(Reserved(s), static_cast<int64_t>(kSmallBuffer));
  EXPECT_EQ(s.requested_bytes[kAllPools].current, 900);
  EXPECT_EQ(s.allocation[kSmallPoolStat].current, 1);
  EXPECT_EQ(s.allocation[kAllPools].allocated, 2);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, ZeroBytesIsNull) {
  auto a = MakeAllocator({});
  EXPECT_EQ(*a->Allocate(0), 0u);
  EXPECT_TRUE(a->Free(0).ok());
}

TEST(CachingAllocator, SmallAndLargePoolsUseSeparateSegments) {
  auto a = MakeAllocator({});
  ASSERT_TRUE(a->Allocate(kMiB).ok());
  ASSERT_TRUE(a->Allocate(kMiB + 1).ok());
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.reserved_bytes[kSmallPoolStat].current, static_cast<int64_t>(kSmallBuffer));
  EXPECT_EQ(s.reserved_bytes[kLargePoolStat].current, static_cast<int64_t>(kLargeBuffer));
  EXPECT_EQ(s.segment[kAllPools].current, 2);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, SplitsBestFitAndCoalesces) {
  auto a = MakeAllocator({});
  DeviceAddress x = *a->Allocate(4 * kMiB);
  DeviceAddress y = *a->Allocate(4 * kMiB);
  DeviceAddress z = *a->Allocate(4 * kMiB);
  EXPECT_EQ(y, x + 4 * kMiB);
  EXPECT_EQ(z, y + 4 * kMiB);
  EXPECT_EQ(a.device->CallCount(BackendCall::kMalloc), 1u);
  ASSERT_TRUE(a->Free(y).ok());
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.inactive_split[kAllPools].current, 2);  // y's hole and the 8 MiB tail
  ASSERT_TRUE(a->Free(x).ok());
  s = a->GetStats();
  EXPECT_EQ(s.inactive_split[kAllPools].current, 2);  // x+y merged, tail
  EXPECT_EQ(s.largest_free_block_bytes, 8 * kMiB);
  EXPECT_NEAR(s.external_fragmentation, 0.5, 1e-9);
  ASSERT_TRUE(a->Free(z).ok());
  s = a->GetStats();
  EXPECT_EQ(s.inactive_split[kAllPools].current, 0);  // one whole segment again
  EXPECT_EQ(s.largest_free_block_bytes, kLargeBuffer);
  EXPECT_EQ(s.external_fragmentation, 0.0);
  // Best fit: a 2 MiB hole is preferred over the 20 MiB block.
  DeviceAddress big = *a->Allocate(6 * kMiB);
  DeviceAddress hole = *a->Allocate(2 * kMiB);
  DeviceAddress keep = *a->Allocate(2 * kMiB);
  ASSERT_TRUE(a->Free(hole).ok());
  EXPECT_EQ(*a->Allocate(2 * kMiB), hole);
  (void)big;
  (void)keep;
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, LargeRemainderBelowOneMiBIsNotSplit) {
  auto a = MakeAllocator({});
  DeviceAddress p = *a->Allocate(19 * kMiB + 600 * kKiB);
  EXPECT_EQ(a->Lookup(p)->size, kLargeBuffer);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, MaxSplitSizeKeepsOversizeBlocksForOversizeRequests) {
  auto a = MakeAllocator({}, {.max_split_size = 40 * kMiB});
  DeviceAddress big = *a->Allocate(100 * kMiB);
  ASSERT_TRUE(a->Free(big).ok());
  DeviceAddress small = *a->Allocate(10 * kMiB);
  EXPECT_NE(small, big);  // did not split the oversize block
  EXPECT_EQ(a.device->CallCount(BackendCall::kMalloc), 2u);
  DeviceAddress again = *a->Allocate(90 * kMiB);  // within kLargeBuffer of 100 MiB
  EXPECT_EQ(again, big);
  EXPECT_EQ(a->Lookup(again)->size, 100 * kMiB);  // oversize blocks are never split
  ASSERT_TRUE(a->Free(again).ok());
  DeviceAddress other = *a->Allocate(60 * kMiB);  // 100 >= 60 + 20: not taken
  EXPECT_NE(other, big);
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.oversize_allocations.current, 1);
  EXPECT_EQ(s.oversize_segments.current, 2);
  EXPECT_EQ(s.max_split_size, 40 * kMiB);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, OutOfMemoryReleasesCacheAndRetries) {
  auto a = MakeAllocator({.capacity_bytes = 100 * kMiB});
  DeviceAddress p = *a->Allocate(60 * kMiB);
  ASSERT_TRUE(a->Free(p).ok());
  auto q = a->Allocate(80 * kMiB);
  ASSERT_TRUE(q.ok()) << q.status();
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(Reserved(s), static_cast<int64_t>(80 * kMiB));
  EXPECT_EQ(a.device->CallCount(BackendCall::kFree), 1u);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, OutOfMemoryErrorExplainsItself) {
  auto a = MakeAllocator({.capacity_bytes = 100 * kMiB});
  ASSERT_TRUE(a->Free(*a->Allocate(80 * kMiB)).ok());
  // Three blocks split from the one cached 80 MiB segment; the middle one
  // becomes a 30 MiB hole that cannot be returned to the device.
  DeviceAddress keep = *a->Allocate(30 * kMiB);
  DeviceAddress hole = *a->Allocate(30 * kMiB);
  DeviceAddress keep2 = *a->Allocate(20 * kMiB);
  (void)keep;
  (void)keep2;
  ASSERT_TRUE(a->Free(hole).ok());
  auto r = a->Allocate(40 * kMiB);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr("tried to allocate 40.00 MiB"));
  EXPECT_THAT(msg, HasSubstr("capacity 100.00 MiB"));
  EXPECT_THAT(msg, HasSubstr("50.00 MiB allocated and 30.00 MiB reserved but unallocated"));
  EXPECT_THAT(msg, HasSubstr("expandable_segments:True"));
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(Reserved(s), static_cast<int64_t>(80 * kMiB));
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, BackendErrorsOtherThanOomPropagate) {
  auto a = MakeAllocator({});
  a.device->InjectFailure(BackendCall::kMalloc, {.code = absl::StatusCode::kInternal});
  auto r = a->Allocate(kMiB);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(a->GetStats().num_ooms, 0);
  EXPECT_TRUE(a->Allocate(kMiB).ok());
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, InjectedOomIsRetriedAfterFreeingCache) {
  auto a = MakeAllocator({});
  DeviceAddress p = *a->Allocate(30 * kMiB);
  ASSERT_TRUE(a->Free(p).ok());
  a.device->InjectFailure(BackendCall::kMalloc, {.count = 1});
  ASSERT_TRUE(a->Allocate(50 * kMiB).ok());
  EXPECT_EQ(a->GetStats().num_alloc_retries, 1);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, MemoryFractionAndHardLimit) {
  auto a = MakeAllocator({.capacity_bytes = 100 * kMiB}, {.memory_fraction = 0.5});
  EXPECT_EQ(a->AllowedBytes(), 50 * kMiB);
  auto r = a->Allocate(60 * kMiB);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("memory_fraction 0.5"));
  EXPECT_TRUE(a->Allocate(40 * kMiB).ok());
  ASSERT_TRUE(a->SetMemoryFraction(1.0).ok());
  EXPECT_TRUE(a->Allocate(40 * kMiB).ok());
  EXPECT_FALSE(a->SetMemoryFraction(0).ok());

  auto b = MakeAllocator({.capacity_bytes = 100 * kMiB}, {.hard_limit_bytes = 30 * kMiB});
  EXPECT_FALSE(b->Allocate(32 * kMiB).ok());
  EXPECT_TRUE(b->Allocate(20 * kMiB).ok());
}

TEST(CachingAllocator, GarbageCollectionReleasesOldestCachedSegments) {
  auto a = MakeAllocator({.capacity_bytes = 100 * kMiB}, {.garbage_collection_threshold = 0.5});
  DeviceAddress p1 = *a->Allocate(30 * kMiB);
  ASSERT_TRUE(a->Free(p1).ok());
  DeviceAddress p2 = *a->Allocate(32 * kMiB);  // misses: 30 MiB too small
  ASSERT_TRUE(a->Free(p2).ok());
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(62 * kMiB));
  // Reserved (62) > 50: the next miss frees the oldest segment (30 MiB) only.
  DeviceAddress p3 = *a->Allocate(34 * kMiB);
  (void)p3;
  MemoryStats s = a->GetStats();
  EXPECT_EQ(Reserved(s), static_cast<int64_t>(66 * kMiB));
  EXPECT_EQ(a.device->CallCount(BackendCall::kFree), 1u);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, EmptyCacheReturnsEverythingUnused) {
  auto a = MakeAllocator({});
  DeviceAddress keep = *a->Allocate(4 * kMiB);
  for (uint64_t size : {kKiB, 3 * kMiB, 30 * kMiB, 300 * kMiB}) ASSERT_TRUE(a->Free(*a->Allocate(size)).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  MemoryStats s = a->GetStats();
  EXPECT_EQ(Reserved(s), static_cast<int64_t>(kLargeBuffer));  // keep's segment
  ASSERT_TRUE(a->Free(keep).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(Reserved(a->GetStats()), 0);
  EXPECT_EQ(a.device->used_bytes(), 0u);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, BadFreesAreClearErrors) {
  auto a = MakeAllocator({});
  DeviceAddress p = *a->Allocate(4096);
  DeviceAddress q = *a->Allocate(4096);
  auto inside = a->Free(p + 512);
  EXPECT_EQ(inside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(inside.message()), HasSubstr("inside the block"));
  auto mismatch = a->Free(p, 100);
  EXPECT_THAT(std::string(mismatch.message()), HasSubstr("allocated with size 4096"));
  EXPECT_TRUE(a->Lookup(p).ok());  // not freed
  ASSERT_TRUE(a->Free(p, 4096).ok());
  auto twice = a->Free(p);
  EXPECT_THAT(std::string(twice.message()), HasSubstr("double free"));
  auto foreign = a->Free(0x1234000);
  EXPECT_THAT(std::string(foreign.message()), HasSubstr("foreign pointer"));
  EXPECT_FALSE(a->RecordStream(p, kDefaultStream).ok());
  EXPECT_EQ(a->Lookup(p).status().code(), absl::StatusCode::kNotFound);
  (void)q;
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, PeakStatsAndReset) {
  auto a = MakeAllocator({});
  DeviceAddress p = *a->Allocate(8 * kMiB);
  DeviceAddress q = *a->Allocate(8 * kMiB);
  ASSERT_TRUE(a->Free(q).ok());
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.allocated_bytes[kAllPools].peak, static_cast<int64_t>(16 * kMiB));
  EXPECT_EQ(s.reserved_bytes_at_peak_allocated, static_cast<int64_t>(kLargeBuffer));
  EXPECT_NEAR(s.reserved_to_allocated_at_peak, 20.0 / 16.0, 1e-9);
  a->ResetPeakStats();
  s = a->GetStats();
  EXPECT_EQ(s.allocated_bytes[kAllPools].peak, static_cast<int64_t>(8 * kMiB));
  a->ResetAccumulatedStats();
  s = a->GetStats();
  EXPECT_EQ(s.allocation[kAllPools].allocated, 0);
  EXPECT_EQ(Allocated(s), static_cast<int64_t>(8 * kMiB));
  (void)p;
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, StatsUsePyTorchKeys) {
  auto a = MakeAllocator({});
  ASSERT_TRUE(a->Allocate(3 * kMiB).ok());
  nlohmann::json j = MemoryStatsToJson(a->GetStats());
  EXPECT_EQ(j["allocated_bytes.all.current"], 3 * kMiB);
  EXPECT_EQ(j["reserved_bytes.large_pool.peak"], kLargeBuffer);
  EXPECT_EQ(j["allocation.small_pool.current"], 0);
  EXPECT_EQ(j["segment.all.allocated"], 1);
  EXPECT_EQ(j["num_device_alloc"], 1);
  for (const char* key : {"active_bytes.all.freed", "inactive_split_bytes.all.peak", "requested_bytes.all.current",
                          "oversize_allocations.current", "num_alloc_retries", "num_ooms", "num_sync_all_streams",
                          "num_device_free", "max_split_size", "external_fragmentation",
                          "largest_free_block_bytes"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_THAT(MemorySummary(a->GetStats()), HasSubstr("reserved memory"));
}

TEST(CachingAllocator, RecordStreamDefersReuseUntilTheOtherStreamIsDone) {
  auto a = MakeAllocator({.auto_complete_events = false});
  StreamHandle s1 = *a.device->CreateStream(), s2 = *a.device->CreateStream();
  DeviceAddress p = *a->Allocate(4 * kMiB, s1);
  ASSERT_TRUE(a->RecordStream(p, s2).ok());
  ASSERT_TRUE(a->RecordStream(p, s1).ok());  // own stream: no-op
  ASSERT_TRUE(a->Free(p).ok());
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.active_bytes[kAllPools].current, static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(Allocated(s), 0);
  DeviceAddress q = *a->Allocate(4 * kMiB, s1);
  EXPECT_NE(q, p);  // still in use on s2
  HEADROOM_EXPECT_VALID(a);
  a.device->CompleteStream(s2);
  DeviceAddress r = *a->Allocate(4 * kMiB, s1);
  EXPECT_EQ(r, p);
  EXPECT_EQ(a.device->HostSynchronizations(), 0u);
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreateEvent), 1u);
  HEADROOM_EXPECT_VALID(a);
  // The event is pooled: a second deferred free creates none.
  ASSERT_TRUE(a->RecordStream(r, s2).ok());
  ASSERT_TRUE(a->Free(r).ok());
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreateEvent), 1u);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, AFreeFromAnotherStreamCountsAsThatStreamsUse) {
  auto a = MakeAllocator({.auto_complete_events = false});
  StreamHandle s1 = *a.device->CreateStream(), s2 = *a.device->CreateStream();
  DeviceAddress p = *a->Allocate(4 * kMiB, s1);
  EXPECT_FALSE(a->Free(p, 1, s2).ok());  // wrong size: nothing changes, not even the stream use
  ASSERT_TRUE(a->Free(p, 4 * kMiB, s1).ok());
  EXPECT_EQ(*a->Allocate(4 * kMiB, s1), p);  // s1 is the block's own stream: reused at once
  ASSERT_TRUE(a->Free(p, std::nullopt, s2).ok());
  EXPECT_EQ(a->GetStats().active_bytes[kAllPools].current, static_cast<int64_t>(4 * kMiB));
  EXPECT_NE(*a->Allocate(4 * kMiB, s1), p);  // waits for s2
  a.device->CompleteStream(s2);
  EXPECT_EQ(*a->Allocate(4 * kMiB, s1), p);
  HEADROOM_EXPECT_VALID(a);
}

// Neither an event nor a host wait can order the free after the other
// stream: the free fails, and the block is kept out of use for good rather
// than handed out or merged with its free neighbours.
TEST(CachingAllocator, AFreeThatCannotWaitForTheOtherStreamQuarantinesTheBlock) {
  auto a = MakeAllocator({.auto_complete_events = false});
  StreamHandle s1 = *a.device->CreateStream(), s2 = *a.device->CreateStream();
  DeviceAddress before = *a->Allocate(4096, s1);
  DeviceAddress p = *a->Allocate(4096, s1);
  DeviceAddress after = *a->Allocate(4096, s1);
  ASSERT_TRUE(a->RecordStream(p, s2).ok());
  a.device->InjectFailure(BackendCall::kRecordEvent, {.count = 1});
  a.device->InjectFailure(BackendCall::kSynchronizeStream, {.count = 1});
  absl::Status freed = a->Free(p);
  EXPECT_FALSE(freed.ok());
  EXPECT_THAT(freed.message(), HasSubstr("kept out of use"));
  HEADROOM_EXPECT_VALID(a);
  MemoryStats s = a->GetStats();
  EXPECT_EQ(Allocated(s), 2 * 4096);
  EXPECT_EQ(s.active_bytes[kAllPools].current, 3 * 4096);
  // Its neighbours free and coalesce around it; it is never handed out again.
  ASSERT_TRUE(a->Free(before).ok());
  ASSERT_TRUE(a->Free(after).ok());
  HEADROOM_EXPECT_VALID(a);
  a.device->CompleteAll();
  for (int i = 0; i < 4; ++i) EXPECT_NE(*a->Allocate(4096, s1), p);
  EXPECT_THAT(a->Free(p).message(), HasSubstr("quarantined"));
  ASSERT_TRUE(a->EmptyCache().ok());
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, BlocksStayOnTheirStreamByDefault) {
  auto a = MakeAllocator({});
  StreamHandle s1 = *a.device->CreateStream(), s2 = *a.device->CreateStream();
  DeviceAddress p = *a->Allocate(4 * kMiB, s1);
  ASSERT_TRUE(a->Free(p).ok());
  DeviceAddress q = *a->Allocate(4 * kMiB, s2);
  EXPECT_NE(q, p);
  EXPECT_EQ(a.device->CallCount(BackendCall::kMalloc), 2u);
  EXPECT_EQ(a->Lookup(q)->stream, s2);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, CrossStreamReuseWaitsOnTheDeviceNotTheHost) {
  auto a = MakeAllocator({.auto_complete_events = false}, {.cross_stream_reuse = true});
  StreamHandle s1 = *a.device->CreateStream(), s2 = *a.device->CreateStream();
  DeviceAddress p = *a->Allocate(4 * kMiB, s1);
  ASSERT_TRUE(a->Free(p).ok());
  DeviceAddress q = *a->Allocate(4 * kMiB, s2);
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.device->CallCount(BackendCall::kMalloc), 1u);
  EXPECT_EQ(a.device->CallCount(BackendCall::kStreamWaitEvent), 1u);
  EXPECT_EQ(a.device->HostSynchronizations(), 0u);
  EXPECT_EQ(a->Lookup(q)->stream, s2);
  HEADROOM_EXPECT_VALID(a);
  ASSERT_TRUE(a->Free(q).ok());
  HEADROOM_EXPECT_VALID(a);
}

// Note [Cross-stream reuse]: a block whose free waits on another stream's
// work serves the request once the requesting stream waits for that work:
// no new memory, no host wait. Without cross-stream reuse the pool grows.
TEST(CachingAllocator, CrossStreamReuseTakesABlockWhoseFreeIsStillPending) {
  for (bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "cross-stream reuse" : "PyTorch's policy");
    auto a = MakeAllocator({.auto_complete_events = false}, {.cross_stream_reuse = reuse});
    StreamHandle s1 = *a.device->CreateStream(), s2 = *a.device->CreateStream();
    DeviceAddress p = *a->Allocate(12 * kMiB, s1);  // a segment of its own
    ASSERT_TRUE(a->RecordStream(p, s2).ok());
    ASSERT_TRUE(a->Free(p).ok());  // waits for s2's work
    EXPECT_EQ(a->GetStats().active_bytes[kAllPools].current, static_cast<int64_t>(12 * kMiB));
    DeviceAddress q = *a->Allocate(12 * kMiB, s1);
    EXPECT_EQ(a.device->HostSynchronizations(), 0u);
    if (reuse) {
      EXPECT_EQ(q, p);
      EXPECT_EQ(a.device->CallCount(BackendCall::kMalloc), 1u);
      EXPECT_EQ(a.device->CallCount(BackendCall::kStreamWaitEvent), 1u);  // s1 waits for s2's event
      EXPECT_EQ(a->Lookup(q)->stream, s1);
    } else {
      EXPECT_NE(q, p);
      EXPECT_EQ(a.device->CallCount(BackendCall::kMalloc), 2u);
    }
    HEADROOM_EXPECT_VALID(a);
    ASSERT_TRUE(a->Free(q).ok());
    a.device->CompleteAll();
    HEADROOM_EXPECT_VALID(a);
  }
}

TEST(CachingAllocator, OomWaitsForPendingFreesBeforeGivingUp) {
  auto a = MakeAllocator({.capacity_bytes = 40 * kMiB, .auto_complete_events = false});
  StreamHandle s1 = *a.device->CreateStream(), s2 = *a.device->CreateStream();
  DeviceAddress p = *a->Allocate(30 * kMiB, s1);
  ASSERT_TRUE(a->RecordStream(p, s2).ok());
  ASSERT_TRUE(a->Free(p).ok());
  auto q = a->Allocate(30 * kMiB, s1);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, p);
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_GE(a.device->HostSynchronizations(), 1u);
  HEADROOM_EXPECT_VALID(a);
}

TEST(CachingAllocator, HistoryAndSnapshot) {
  auto a = MakeAllocator({});
  ASSERT_TRUE(a->Allocate(kKiB).ok());  // not recorded: history is off
  a->SetHistoryCapacity(100);
  DeviceAddress p = *a->Allocate(4 * kMiB);
  ASSERT_TRUE(a->Free(p).ok());
  AllocatorSnapshot snap = a->TakeSnapshot();
  ASSERT_EQ(snap.trace.size(), 4u);
  EXPECT_EQ(snap.trace[0].action, TraceAction::kSegmentAlloc);
  EXPECT_EQ(snap.trace[1].action, TraceAction::kAlloc);
  EXPECT_EQ(snap.trace[2].action, TraceAction::kFreeRequested);
  EXPECT_EQ(snap.trace[3].action, TraceAction::kFreeCompleted);
  EXPECT_LT(snap.trace[0].time_ns, snap.trace[3].time_ns);
  nlohmann::json j = SnapshotToJson(snap);
  ASSERT_EQ(j["segments"].size(), 2u);
  const nlohmann::json& small = j["segments"][0]["segment_type"] == "small" ? j["segments"][0] : j["segments"][1];
  EXPECT_EQ(small["total_size"], kSmallBuffer);
  EXPECT_EQ(small["allocated_size"], kKiB);
  EXPECT_EQ(small["blocks"][0]["state"], "active_allocated");
  EXPECT_EQ(small["blocks"][1]["state"], "inactive");
  EXPECT_EQ(j["device_traces"][0][1]["action"], "alloc");
  EXPECT_EQ(j["device_traces"][0][1]["addr"], p);
  EXPECT_EQ(j["device_traces"][0][1]["size"], 4 * kMiB);
}

// The model the snapshot tests check against (memory_viz_model.h) finds what
// would break memory_viz: a block that returns outside every segment, a
// mapped range in no segment.
TEST(MemoryVizModel, FindsBlocksAndRangesOutsideEverySegment) {
  auto event = [](const char* action, uint64_t address, uint64_t size) {
    return nlohmann::json{{"action", action}, {"addr", address}, {"size", size}, {"stream", 0}};
  };
  nlohmann::json snapshot = {
      {"segments", {{{"device", 0}, {"address", 0x100000}, {"total_size", 0x100000}, {"stream", 0},
                     {"blocks", {{{"address", 0x100000}, {"size", 0x100000}, {"state", "inactive"}}}}}}},
      {"device_traces", {{event("segment_alloc", 0x100000, 0x100000), event("alloc", 0x100000, 0x1000),
                          event("free_requested", 0x100000, 0x1000), event("free_completed", 0x100000, 0x1000)}}}};
  EXPECT_EQ(testing::DrawableByMemoryViz(snapshot), absl::OkStatus());
  nlohmann::json outside = snapshot;
  outside["device_traces"][0].push_back(event("alloc", 0x300000, 0x1000));
  outside["device_traces"][0].push_back(event("free_requested", 0x300000, 0x1000));
  outside["device_traces"][0].push_back(event("free_completed", 0x300000, 0x1000));
  EXPECT_THAT(std::string(testing::DrawableByMemoryViz(outside).message()), HasSubstr("lies in no segment"));
  nlohmann::json unmapped = snapshot;
  unmapped["device_traces"][0].push_back(event("segment_map", 0x300000, 0x200000));
  EXPECT_THAT(std::string(testing::DrawableByMemoryViz(unmapped).message()), HasSubstr("no segment holds"));
}

TEST(HistoryRing, KeepsTheNewestEntries) {
  HistoryRing ring(3);
  for (uint64_t i = 0; i < 5; ++i) ring.Add({.address = i});
  std::vector<TraceEntry> entries = ring.Entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].address, 2u);
  EXPECT_EQ(entries[2].address, 4u);
  EXPECT_EQ(ring.dropped(), 2u);
  HistoryRing off;
  off.Add({});
  EXPECT_TRUE(off.Entries().empty());
  EXPECT_EQ(TraceActionFromName("segment_unmap"), TraceAction::kSegmentUnmap);
  EXPECT_FALSE(TraceActionFromName("nope").has_value());
}

}  // namespace
}  // namespace headroom
