// Note [Expandable segments] on the simulated device.
#include "allocator/caching_allocator.h"
#include "common/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/allocator/allocator_test_util.h"

namespace headroom {
namespace {

using ::headroom::testing::MakeAllocator;
using ::headroom::testing::SimulatedAllocator;

int64_t Reserved(const MemoryStats& s) { return s.reserved_bytes[kAllPools].current; }

// Most tests follow the mapping page by page, so both pools grow by the
// device's 2 MiB granularity here; the default 20 MiB large-pool page has
// tests of its own below.
const AllocatorOptions kTwoMiBPages{.expandable_segments = true, .expandable_large_page_bytes = 2 * kMiB};

TEST(ExpandableSegments, GrowContiguouslyPageByPage) {
  auto a = MakeAllocator({}, kTwoMiBPages);
  DeviceAddress x = *a->Allocate(5 * kMiB);
  DeviceAddress y = *a->Allocate(5 * kMiB);
  DeviceAddress z = *a->Allocate(5 * kMiB);
  EXPECT_EQ(y, x + 5 * kMiB);
  EXPECT_EQ(z, y + 5 * kMiB);
  MemoryStats s = a->GetStats();
  EXPECT_EQ(Reserved(s), static_cast<int64_t>(16 * kMiB));  // 8 pages for 15 MiB
  EXPECT_EQ(s.segment[kAllPools].current, 1);
  EXPECT_EQ(a.device->CallCount(BackendCall::kReserveAddressRange), 1u);
  EXPECT_EQ(a.device->CallCount(BackendCall::kMalloc), 0u);
  EXPECT_EQ(a.device->used_bytes(), 16 * kMiB);
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, OneReservationPerStreamAndPool) {
  auto a = MakeAllocator({}, {.expandable_segments = true});
  StreamHandle s2 = *a.device->CreateStream();
  ASSERT_TRUE(a->Allocate(kKiB).ok());
  ASSERT_TRUE(a->Allocate(4 * kMiB).ok());
  ASSERT_TRUE(a->Allocate(4 * kMiB, s2).ok());
  ASSERT_TRUE(a->Allocate(kKiB).ok());
  EXPECT_EQ(a.device->CallCount(BackendCall::kReserveAddressRange), 3u);
  EXPECT_EQ(a->GetStats().segment[kAllPools].current, 3);
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, TrimUnmapsFreePagesAndHolesAreRefilledFirst) {
  auto a = MakeAllocator({}, kTwoMiBPages);
  DeviceAddress x = *a->Allocate(5 * kMiB);
  DeviceAddress y = *a->Allocate(5 * kMiB);
  DeviceAddress z = *a->Allocate(5 * kMiB);
  (void)z;
  ASSERT_TRUE(a->Free(y).ok());
  const uint64_t syncs = a.device->HostSynchronizations();
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_GT(a.device->HostSynchronizations(), syncs);  // the owning stream first
  // y = [5, 10) MiB; the pages [6, 8) and [8, 10) lie wholly inside it. The
  // 1 MiB free tail past z shares its page with z and stays mapped.
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(12 * kMiB));
  HEADROOM_EXPECT_VALID(a);
  const uint64_t maps = a.device->CallCount(BackendCall::kMap);
  // 2 MiB fits in [5, 6) + one page of the hole: mapped there, not at the end.
  DeviceAddress w = *a->Allocate(2 * kMiB);
  EXPECT_EQ(w, x + 5 * kMiB);
  EXPECT_EQ(a.device->CallCount(BackendCall::kMap), maps + 1);
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(14 * kMiB));
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, EmptyCacheReleasesUnusedReservations) {
  auto a = MakeAllocator({}, {.expandable_segments = true});
  DeviceAddress p = *a->Allocate(30 * kMiB);
  ASSERT_TRUE(a->Free(p).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(Reserved(a->GetStats()), 0);
  EXPECT_EQ(a->GetStats().segment[kAllPools].current, 0);
  EXPECT_EQ(a.device->used_bytes(), 0u);
  EXPECT_EQ(a.device->live_reservations(), 0u);
  EXPECT_EQ(a.device->live_physical_handles(), 0u);
  HEADROOM_EXPECT_VALID(a);
  EXPECT_TRUE(a->Allocate(3 * kMiB).ok());
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, OutOfMemoryUnmapsCachedPagesAndRetries) {
  auto a = MakeAllocator({.capacity_bytes = 64 * kMiB}, {.expandable_segments = true});
  StreamHandle s2 = *a.device->CreateStream();
  DeviceAddress p = *a->Allocate(40 * kMiB);
  ASSERT_TRUE(a->Free(p).ok());  // 40 MiB cached on the default stream
  auto q = a->Allocate(40 * kMiB, s2);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(a->GetStats().num_alloc_retries, 1);
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(40 * kMiB));
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, MapFailureLeavesTheSegmentUnchanged) {
  auto a = MakeAllocator({}, kTwoMiBPages);
  ASSERT_TRUE(a->Allocate(4 * kMiB).ok());
  a.device->InjectFailure(BackendCall::kMap, {.skip = 1, .code = absl::StatusCode::kInternal});
  auto r = a->Allocate(6 * kMiB);  // needs 3 pages; the second Map fails
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(a.device->used_bytes(), 4 * kMiB);
  HEADROOM_EXPECT_VALID(a);
  EXPECT_TRUE(a->Allocate(6 * kMiB).ok());
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, OverheadOnAGrowingSequenceIsOnePage) {
  auto a = MakeAllocator({}, kTwoMiBPages);
  uint64_t total = 0;
  std::vector<DeviceAddress> live;
  for (uint64_t i = 1; i <= 40; ++i) {
    const uint64_t size = i * 3 * kMiB + i * 1000;
    total += RoundSize(size, {});
    live.push_back(*a->Allocate(size));
  }
  MemoryStats s = a->GetStats();
  EXPECT_LT(static_cast<uint64_t>(Reserved(s)), total + 2 * kMiB);
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, LargePoolGrowsBy20MiBPagesByDefault) {
  auto a = MakeAllocator({}, {.expandable_segments = true});
  DeviceAddress x = *a->Allocate(5 * kMiB);
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(20 * kMiB));
  // Three more fit in the first page: no further Map calls (10 per page).
  const uint64_t maps = a.device->CallCount(BackendCall::kMap);
  DeviceAddress last = 0;
  for (int i = 0; i < 3; ++i) last = *a->Allocate(5 * kMiB);
  EXPECT_EQ(last, x + 15 * kMiB);
  EXPECT_EQ(a.device->CallCount(BackendCall::kMap), maps);
  ASSERT_TRUE(a->Allocate(5 * kMiB).ok());
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(40 * kMiB));
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, SmallPoolGrowsBy2MiBPages) {
  auto a = MakeAllocator({}, {.expandable_segments = true});
  ASSERT_TRUE(a->Allocate(kKiB).ok());
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(2 * kMiB));
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, PageSizesRoundUpToTheGranularity) {
  auto a = MakeAllocator({}, {.expandable_segments = true, .expandable_large_page_bytes = 3 * kMiB});
  ASSERT_TRUE(a->Allocate(5 * kMiB).ok());
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(8 * kMiB));  // two 4 MiB pages
  HEADROOM_EXPECT_VALID(a);
  auto device = SimulatedBackend::Create({});
  ASSERT_TRUE(device.ok());
  EXPECT_FALSE(CachingAllocator::Create(device->get(), {.expandable_segments = true, .expandable_large_page_bytes = 0}).ok());
}

// Note [Expandable page table]: the reservation is larger than the device,
// the page table only as large as what was mapped. Sized from the capacity,
// a 64 PiB device needed a 256 GiB table before the first allocation.
TEST(ExpandableSegments, PageTableFollowsMappedPagesNotTheCapacity) {
  auto a = MakeAllocator({.capacity_bytes = kMaxSimulatedCapacity}, kTwoMiBPages);
  const StreamHandle other = *a.device->CreateStream();
  std::vector<DeviceAddress> blocks;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<DeviceAddress> p = a->Allocate(3 * kMiB, i % 2 == 0 ? kDefaultStream : other);
    ASSERT_TRUE(p.ok()) << p.status();
    blocks.push_back(*p);
  }
  HEADROOM_EXPECT_VALID(a);
  for (size_t i = 0; i < blocks.size(); i += 2) ASSERT_TRUE(a->Free(blocks[i]).ok());
  ASSERT_TRUE(a->EmptyCache().ok());  // unmaps the freed pages, holes and tail alike
  HEADROOM_EXPECT_VALID(a);
  ASSERT_TRUE(a->Allocate(5 * kMiB).ok());  // refills a hole, then grows the tail
  HEADROOM_EXPECT_VALID(a);
  for (size_t i = 1; i < blocks.size(); i += 2) ASSERT_TRUE(a->Free(blocks[i]).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  HEADROOM_EXPECT_VALID(a);
  EXPECT_EQ(a->GetStats().segment[kAllPools].current, 1);  // the default stream's, still holding 5 MiB
}

// A 20 MiB device with a hole at the start of its segment: 10 MiB live at
// [6, 16) MiB. Growth past the hole needs addresses beyond the device's size.
SimulatedAllocator WithAHoleBelowTheEnd(AllocatorOptions options) {
  auto a = MakeAllocator({.capacity_bytes = 20 * kMiB}, options);
  const DeviceAddress hole = *a->Allocate(6 * kMiB);
  EXPECT_TRUE(a->Allocate(10 * kMiB).ok());
  EXPECT_TRUE(a->Free(hole).ok());
  EXPECT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(10 * kMiB));
  return a;
}

// As PyTorch's ExpandableSegment, a reservation holds 1 1/8 of the device in
// whole pages (here 22.5 MiB, so 24), so a replay runs out of addresses where
// PyTorch does: growth up to 24 MiB maps, past it fails with memory left.
TEST(ExpandableSegments, AReservationIsAnEighthLargerThanTheDevice) {
  auto a = WithAHoleBelowTheEnd(kTwoMiBPages);
  const absl::StatusOr<DeviceAddress> to_24 = a->Allocate(8 * kMiB);  // [16, 24)
  ASSERT_TRUE(to_24.ok()) << to_24.status();
  HEADROOM_EXPECT_VALID(a);
  ASSERT_TRUE(a->Free(*to_24).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  const absl::StatusOr<DeviceAddress> to_26 = a->Allocate(10 * kMiB);  // fits the device, not the addresses
  ASSERT_FALSE(to_26.ok());
  EXPECT_EQ(to_26.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(to_26.status().message()),
              ::testing::HasSubstr("no unmapped range of the 24.00 MiB expandable segment can hold 10.00 MiB"));
  HEADROOM_EXPECT_VALID(a);
}

// Moving pages leaves a hole at each move, so Headroom's policy reserves
// twice the device: the same growth runs out of memory, not addresses.
TEST(ExpandableSegments, MovingPagesReservesTwiceTheDevice) {
  AllocatorOptions moving = kTwoMiBPages;
  moving.move_free_pages = true;
  auto a = WithAHoleBelowTheEnd(moving);
  ASSERT_TRUE(a->Allocate(10 * kMiB).ok());  // [16, 26)
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(20 * kMiB));
  HEADROOM_EXPECT_VALID(a);
}

// Note [Moving free pages]: pages a large block no longer uses serve the
// small pool, and then another stream, without new device memory.
TEST(ExpandableSegments, FreePagesMoveBetweenPoolsAndStreams) {
  const AllocatorOptions kMoving{.expandable_segments = true,
                                     .expandable_large_page_bytes = 2 * kMiB,
                                     .move_free_pages = true};
  auto a = MakeAllocator({}, kMoving);
  const DeviceAddress large = *a->Allocate(8 * kMiB);  // 4 pages of the large pool
  ASSERT_TRUE(a->Free(large).ok());
  const uint64_t created = a.device->CallCount(BackendCall::kCreatePhysical);
  EXPECT_EQ(created, 4u);
  // Small blocks fill three fresh small-pool pages: the large pool's free pages move there.
  std::vector<DeviceAddress> small;
  for (int i = 0; i < 3 * 2048; ++i) small.push_back(*a->Allocate(kKiB));
  MemoryStats s = a->GetStats();
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), created);
  EXPECT_EQ(Reserved(s), static_cast<int64_t>(8 * kMiB));
  EXPECT_EQ(s.reserved_bytes[kSmallPoolStat].current, static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(s.reserved_bytes[kLargePoolStat].current, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(a.device->CallCount(BackendCall::kUnmap), 3u);  // the small pool grows a page at a time
  HEADROOM_EXPECT_VALID(a);
  // The last free page serves a large block on another stream.
  const StreamHandle other = *a.device->CreateStream();
  const DeviceAddress elsewhere = *a->Allocate(2 * kMiB, other);
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), created);
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(8 * kMiB));
  HEADROOM_EXPECT_VALID(a);
  // With nothing left to move, growth creates pages as before.
  const DeviceAddress more = *a->Allocate(2 * kMiB, other);
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), created + 1);
  for (DeviceAddress p : small) ASSERT_TRUE(a->Free(p).ok());
  ASSERT_TRUE(a->Free(elsewhere).ok());
  ASSERT_TRUE(a->Free(more).ok());
  a.device->CompleteAll();
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(Reserved(a->GetStats()), 0);
  EXPECT_EQ(a.device->used_bytes(), 0u);
  HEADROOM_EXPECT_VALID(a);
}

// Without it, the same sequence creates the small pool's pages anew.
TEST(ExpandableSegments, WithoutMovingEachPoolKeepsItsOwnPages) {
  auto a = MakeAllocator({}, kTwoMiBPages);
  ASSERT_TRUE(a->Free(*a->Allocate(8 * kMiB)).ok());
  std::vector<DeviceAddress> small;
  for (int i = 0; i < 3 * 2048; ++i) small.push_back(*a->Allocate(kKiB));
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), 7u);
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(14 * kMiB));
}

TEST(ExpandableSegments, MovingPagesNeedsExpandableSegments) {
  auto device = *SimulatedBackend::Create({});
  EXPECT_EQ(CachingAllocator::Create(device.get(), {.move_free_pages = true}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Note [Moving free pages]: below the threshold growth creates pages and leaves the free ones where they are;
// only what would go past it is moved.
TEST(ExpandableSegments, PagesMoveOnlyPastTheThreshold) {
  auto a = MakeAllocator({}, {.expandable_segments = true,
                              .expandable_large_page_bytes = 2 * kMiB,
                              .move_free_pages = true,
                              .move_threshold = 1.5});
  ASSERT_TRUE(a->Free(*a->Allocate(8 * kMiB)).ok());  // peak allocated 8 MiB: the bound is 12 MiB
  a->ResetPeakStats();  // as a loop that measures each step does; the bound keeps the run's peak
  std::vector<DeviceAddress> small;
  for (int i = 0; i < 3 * 2048; ++i) small.push_back(*a->Allocate(kKiB));  // three small-pool pages
  // Two pages created (8 + 4 = 12 MiB reserved), the third moved from the large pool.
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), 6u);
  EXPECT_EQ(a.device->CallCount(BackendCall::kUnmap), 1u);
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(12 * kMiB));
  HEADROOM_EXPECT_VALID(a);
  for (DeviceAddress p : small) ASSERT_TRUE(a->Free(p).ok());
}

// Note [Moving free pages]: a page moved widens the room by a page, up to move_threshold_max. The large pool's
// 8 MiB block comes back after a page of it moved to the small pool: with the wider room the hole is refilled
// by a new page; without it (or with too low a maximum), the page moves back, and would every iteration.
TEST(ExpandableSegments, MovesWidenTheRoomUpToTheMaximum) {
  struct Case {
    double max;
    uint64_t created, unmapped;
    int64_t reserved;
  };
  for (const Case c : {Case{2.0, 7, 1, 14 * kMiB}, Case{1.0, 6, 2, 12 * kMiB}, Case{1.6, 6, 2, 12 * kMiB}}) {
    SCOPED_TRACE(c.max);
    auto a = MakeAllocator({}, {.expandable_segments = true,
                                .expandable_large_page_bytes = 2 * kMiB,
                                .move_free_pages = true,
                                .move_threshold = 1.5,
                                .move_threshold_max = c.max});
    ASSERT_TRUE(a->Free(*a->Allocate(8 * kMiB)).ok());  // the room: 12 MiB
    std::vector<DeviceAddress> small;
    for (int i = 0; i < 3 * 2048; ++i) small.push_back(*a->Allocate(kKiB));  // 2 pages created, 1 moved
    for (DeviceAddress p : small) ASSERT_TRUE(a->Free(p).ok());
    ASSERT_TRUE(a->Free(*a->Allocate(8 * kMiB)).ok());  // the large pool's hole is mapped again
    EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), c.created);
    EXPECT_EQ(a.device->CallCount(BackendCall::kUnmap), c.unmapped);
    EXPECT_EQ(Reserved(a->GetStats()), c.reserved);
    HEADROOM_EXPECT_VALID(a);
  }
}

// The memory limit bounds creation too: a high threshold still moves pages rather than run out of memory.
TEST(ExpandableSegments, AtTheMemoryLimitPagesMoveWhateverTheThreshold) {
  auto a = MakeAllocator({.capacity_bytes = 10 * kMiB}, {.expandable_segments = true,
                                                          .expandable_large_page_bytes = 2 * kMiB,
                                                          .move_free_pages = true,
                                                          .move_threshold = 100});
  ASSERT_TRUE(a->Free(*a->Allocate(8 * kMiB)).ok());
  std::vector<DeviceAddress> small;
  for (int i = 0; i < 3 * 2048; ++i) small.push_back(*a->Allocate(kKiB));
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), 5u);  // one page created, two moved
  EXPECT_EQ(a.device->CallCount(BackendCall::kUnmap), 2u);
  const MemoryStats s = a->GetStats();
  EXPECT_EQ(Reserved(s), static_cast<int64_t>(10 * kMiB));
  EXPECT_EQ(s.num_alloc_retries, 0);  // no out-of-memory flush was needed
  HEADROOM_EXPECT_VALID(a);
  for (DeviceAddress p : small) ASSERT_TRUE(a->Free(p).ok());
}

// [a0 4 | free 4 | hole 8 | free 8 | a4 2] MiB in one segment of 2 MiB pages that moves free pages: 18 MiB
// reserved, with `limit_mib` allowed from now on. The layout a moved page leaves behind on a real run.
struct Layout {
  SimulatedAllocator a;
  DeviceAddress base;  // a0, the segment's start
};
Layout HoleBetweenFreeBlocks(int limit_mib) {
  auto a = MakeAllocator({.capacity_bytes = 32 * kMiB}, {.expandable_segments = true,
                                                          .expandable_large_page_bytes = 2 * kMiB,
                                                          .move_free_pages = true});
  const DeviceAddress base = *a->Allocate(4 * kMiB);
  const DeviceAddress a1 = *a->Allocate(4 * kMiB);
  const DeviceAddress a2 = *a->Allocate(8 * kMiB);
  const DeviceAddress a3 = *a->Allocate(8 * kMiB);
  (void)*a->Allocate(2 * kMiB);
  EXPECT_TRUE(a->Free(a2).ok());
  EXPECT_TRUE(a->EmptyCache().ok());  // the hole
  EXPECT_TRUE(a->Free(a1).ok());
  EXPECT_TRUE(a->Free(a3).ok());
  EXPECT_TRUE(a->SetMemoryFraction(limit_mib / 32.0).ok());
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(18 * kMiB));
  return {std::move(a), base};
}

// Note [Moving free pages]: the free blocks around the hole give pages when the request does not join them.
// Before, both neighbours were kept whatever the request, so each case created pages past the limit and needed
// an out-of-memory flush.
TEST(ExpandableSegments, FreeBlocksTheRequestDoesNotJoinGiveTheirPages) {
  struct Case {
    const char* what;
    int limit_mib;
    uint64_t request, offset;  // where the request lands, from the segment's start
    uint64_t created;
    int64_t reserved;
  };
  for (const Case c : {
           // 12 MiB joins the free block below the hole; the one above gives its pages but its lowest, which
           // borders the hole: three moved, one created.
           Case{"the free block above gives its pages", 20, 12 * kMiB, 4 * kMiB, 1, 20 * kMiB},
           // 18 MiB would span the hole and both free blocks, which then could give nothing: the growth goes
           // past the end instead, where their pages cover it: six moved, three created.
           Case{"growth goes where free pages cover it", 24, 18 * kMiB, 26 * kMiB, 3, 24 * kMiB},
       }) {
    SCOPED_TRACE(c.what);
    auto [a, base] = HoleBetweenFreeBlocks(c.limit_mib);
    const uint64_t created = a.device->CallCount(BackendCall::kCreatePhysical);
    EXPECT_EQ(*a->Allocate(c.request), base + c.offset);
    EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), created + c.created);
    const MemoryStats s = a->GetStats();
    EXPECT_EQ(Reserved(s), c.reserved);
    EXPECT_EQ(s.num_alloc_retries, 0);
    HEADROOM_EXPECT_VALID(a);
  }
}

// Note [One pool]: small requests take the large pool's free memory; no small-pool segment is made.
TEST(ExpandableSegments, OnePoolServesSmallRequestsFromLargeFreeBlocks) {
  auto a = MakeAllocator({}, {.expandable_segments = true,
                              .expandable_large_page_bytes = 2 * kMiB,
                              .unified_pool = true});
  ASSERT_TRUE(a->Free(*a->Allocate(8 * kMiB)).ok());
  std::vector<DeviceAddress> small;
  for (int i = 0; i < 3 * 2048; ++i) small.push_back(*a->Allocate(kKiB));
  const MemoryStats s = a->GetStats();
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), 4u);  // the 8 MiB only
  EXPECT_EQ(Reserved(s), static_cast<int64_t>(8 * kMiB));
  EXPECT_EQ(s.segment[kAllPools].current, 1);
  EXPECT_EQ(s.allocated_bytes[kLargePoolStat].current, static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(s.allocated_bytes[kSmallPoolStat].current, 0);
  HEADROOM_EXPECT_VALID(a);
  // Freed, they coalesce back into the one 8 MiB block a large request takes whole.
  for (DeviceAddress p : small) ASSERT_TRUE(a->Free(p).ok());
  ASSERT_TRUE(a->Allocate(8 * kMiB).ok());
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), 4u);
  HEADROOM_EXPECT_VALID(a);
}

// In one pool a small request still grows the segment by a small page, whatever the large pages are.
TEST(ExpandableSegments, OnePoolGrowsBySmallPagesForSmallRequests) {
  auto a = MakeAllocator({}, {.expandable_segments = true, .unified_pool = true});  // 20 MiB large pages
  ASSERT_TRUE(a->Allocate(kKiB).ok());
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(2 * kMiB));
  ASSERT_TRUE(a->Allocate(4 * kMiB).ok());  // a large request: one 20 MiB page, joined to the free rest
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(22 * kMiB));
  HEADROOM_EXPECT_VALID(a);
}

// Note [Growable blocks]. The segment's pages hold a free block of `hole` MiB at its start, a live 2 MiB fence,
// then a free block of `tail` MiB that unmapped space follows. Returns where a request of `request` MiB goes, in
// MiB from the start, and how many pages it created.
struct Placed {
  uint64_t offset_mib = 0;
  uint64_t new_pages = 0;
};
Placed PlaceBesideAGrowableBlock(const AllocatorOptions& options, uint64_t hole, uint64_t tail, uint64_t request) {
  auto a = MakeAllocator({}, options);
  const DeviceAddress start = *a->Allocate(hole * kMiB);
  EXPECT_TRUE(a->Allocate(2 * kMiB).ok());
  const DeviceAddress last = *a->Allocate(tail * kMiB);
  EXPECT_EQ(Reserved(a->GetStats()), static_cast<int64_t>((hole + 2 + tail) * kMiB));  // no free page past it
  EXPECT_TRUE(a->Free(last).ok());
  EXPECT_TRUE(a->Free(start).ok());
  const uint64_t pages = a.device->CallCount(BackendCall::kCreatePhysical);
  const DeviceAddress placed = *a->Allocate(request * kMiB);
  const absl::Status valid = a->Validate();
  EXPECT_TRUE(valid.ok()) << valid;
  return {(placed - start) / kMiB, a.device->CallCount(BackendCall::kCreatePhysical) - pages};
}

TEST(ExpandableSegments, ARequestPassesOverTheBlockThatGrowthWouldExtend) {
  // The smaller block is the one before unmapped space: the request takes the other, as PyTorch's does.
  EXPECT_EQ(PlaceBesideAGrowableBlock(kTwoMiBPages, 5, 3, 2).offset_mib, 0u);
  // Where nothing else fits it is taken all the same, and no page is created.
  const Placed only_fit = PlaceBesideAGrowableBlock(kTwoMiBPages, 2, 4, 3);
  EXPECT_EQ(only_fit.offset_mib, 4u);
  EXPECT_EQ(only_fit.new_pages, 0u);
}

// PyTorch's walk compares each block with the next one of at least the request's size: from the tail (3 MiB,
// unmapped space after it) to the block before a hole (6 MiB and a 2 MiB hole: 8) to a block of 7 MiB.
TEST(ExpandableSegments, TheWalkGoesOnWhileTheNextBlockCanGrowLess) {
  auto a = MakeAllocator({}, kTwoMiBPages);
  const DeviceAddress start = *a->Allocate(5 * kMiB);   // [0, 5)
  const DeviceAddress to_hole = *a->Allocate(3 * kMiB);  // [5, 8): its whole page [6, 8) becomes the hole
  const DeviceAddress seven = *a->Allocate(7 * kMiB);    // [8, 15)
  ASSERT_TRUE(a->Allocate(2 * kMiB).ok());               // [15, 17), live
  const DeviceAddress tail = *a->Allocate(3 * kMiB);     // [17, 20)
  ASSERT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(20 * kMiB));
  ASSERT_TRUE(a->Free(to_hole).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  ASSERT_EQ(Reserved(a->GetStats()), static_cast<int64_t>(18 * kMiB));  // [6, 8) unmapped
  ASSERT_TRUE(a->Free(start).ok());  // [0, 6), then the hole
  ASSERT_TRUE(a->Free(seven).ok());
  ASSERT_TRUE(a->Free(tail).ok());
  EXPECT_EQ(*a->Allocate(3 * kMiB), start + 8 * kMiB);
  HEADROOM_EXPECT_VALID(a);
}

// Note [Page-aligned growth]. A live block of `first` MiB at the segment's start leaves the rest of its page free at
// the end of the mapped pages; a request of `request` MiB then grows the segment. Returns where it went, in MiB from
// the start, the pages reserved then, and those reserved once the first block is freed and the cache emptied.
struct Grown {
  double offset_mib = 0;
  uint64_t reserved_mib = 0;
  uint64_t reserved_after_free_mib = 0;
};
Grown GrowAfterAPartlyUsedPage(bool align, double first, double request) {
  AllocatorOptions options = kTwoMiBPages;
  options.unified_pool = true;  // small and large blocks share pages
  options.align_growth = align;
  auto a = MakeAllocator({}, options);
  const DeviceAddress start = *a->Allocate(static_cast<uint64_t>(first * kMiB));
  const DeviceAddress placed = *a->Allocate(static_cast<uint64_t>(request * kMiB));
  Grown grown{.offset_mib = static_cast<double>(placed - start) / kMiB,
              .reserved_mib = static_cast<uint64_t>(Reserved(a->GetStats())) / kMiB};
  EXPECT_TRUE(a->Free(start).ok());
  EXPECT_TRUE(a->EmptyCache().ok());
  grown.reserved_after_free_mib = static_cast<uint64_t>(Reserved(a->GetStats())) / kMiB;
  const absl::Status valid = a->Validate();
  EXPECT_TRUE(valid.ok()) << valid;
  return grown;
}

TEST(ExpandableSegments, AlignedGrowthLeavesTheSharedPageToSmallBlocks) {
  // Joining the 1.5 MiB left in the first page, 4 MiB straddle three pages, and the first stays mapped beside it
  // once the small block is gone.
  const Grown joined = GrowAfterAPartlyUsedPage(false, 0.5, 4);
  EXPECT_EQ(joined.offset_mib, 0.5);
  EXPECT_EQ(joined.reserved_mib, 6u);
  EXPECT_EQ(joined.reserved_after_free_mib, 6u);
  // From the next page boundary it maps as many pages, and the first page empties with the small block.
  const Grown aligned = GrowAfterAPartlyUsedPage(true, 0.5, 4);
  EXPECT_EQ(aligned.offset_mib, 2.0);
  EXPECT_EQ(aligned.reserved_mib, 6u);
  EXPECT_EQ(aligned.reserved_after_free_mib, 4u);
  // A request under a page joins the free block as before.
  EXPECT_EQ(GrowAfterAPartlyUsedPage(true, 0.5, 1.75).offset_mib, 0.5);
  // Where starting at the boundary would map one page more (0.5 MiB free in the first page, 4.5 MiB asked), it
  // does not.
  const Grown costly = GrowAfterAPartlyUsedPage(true, 1.5, 4.5);
  EXPECT_EQ(costly.offset_mib, 1.5);
  EXPECT_EQ(costly.reserved_mib, 6u);
}

TEST(ExpandableSegments, AlignedGrowthKeepsTheFreeTailOfTheSharedPage) {
  AllocatorOptions options = kTwoMiBPages;
  options.unified_pool = true;  // small and large blocks share pages
  options.align_growth = true;
  auto a = MakeAllocator({}, options);
  const DeviceAddress start = *a->Allocate(kMiB / 2);
  ASSERT_EQ(*a->Allocate(4 * kMiB), start + 2 * kMiB);
  const uint64_t pages = a.device->CallCount(BackendCall::kCreatePhysical);
  EXPECT_EQ(*a->Allocate(kMiB), start + kMiB / 2);  // the first page's free tail, no new page
  EXPECT_EQ(a.device->CallCount(BackendCall::kCreatePhysical), pages);
  HEADROOM_EXPECT_VALID(a);
}

TEST(ExpandableSegments, NewPolicyOptionsAreCheckedAtCreation) {
  auto device = *SimulatedBackend::Create({});
  EXPECT_EQ(CachingAllocator::Create(device.get(), {.unified_pool = true}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CachingAllocator::Create(device.get(), {.expandable_segments = true, .move_threshold = 1.5})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // a threshold for moves that are off
  EXPECT_EQ(CachingAllocator::Create(device.get(),
                                     {.expandable_segments = true, .move_free_pages = true, .move_threshold = 0.5})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CachingAllocator::Create(device.get(), {.expandable_segments = true, .move_threshold_max = 1.05})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // a maximum for moves that are off
  const absl::Status below = CachingAllocator::Create(device.get(), {.expandable_segments = true,
                                                                      .move_free_pages = true,
                                                                      .move_threshold = 1.05,
                                                                      .move_threshold_max = 1.03})
                                 .status();
  EXPECT_EQ(below.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(below.message()),
              ::testing::HasSubstr("move_threshold_max 1.03 is below move_threshold 1.05"));
}

}  // namespace
}  // namespace headroom
