// Note [Stitched blocks] on the simulated device, whose host backing maps a
// physical page's bytes wherever the page is mapped, as the CUDA driver does.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "common/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/allocator/allocator_test_util.h"
#include "tests/allocator/memory_viz_model.h"

namespace headroom {
namespace {

using ::headroom::testing::MakeAllocator;
using ::headroom::testing::SimulatedAllocator;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

AllocatorOptions Options(bool stitch) {
  return {.expandable_segments = true,
          .expandable_large_page_bytes = 2 * kMiB,
          .unified_pool = true,
          .stitch_pages = stitch};
}

SimulatedAllocator Device(bool stitch, uint64_t pages = 3, bool auto_complete_events = true) {
  return MakeAllocator(
      {.capacity_bytes = pages * 2 * kMiB, .auto_complete_events = auto_complete_events, .host_backing = true},
      Options(stitch));
}

// Four 1 MiB blocks on the first two pages and a 2 MiB block on the third fill
// the device; the first and the fourth are freed: 2 MiB free, in a head of
// page 0 and a tail of page 1, neither next to the other.
struct Pieces {
  DeviceAddress head, second, third, tail, last;
};
Pieces FreeTwoPieces(SimulatedAllocator& a) {
  Pieces p{};
  p.head = *a->Allocate(kMiB);
  p.second = *a->Allocate(kMiB);
  p.third = *a->Allocate(kMiB);
  p.tail = *a->Allocate(kMiB);
  p.last = *a->Allocate(2 * kMiB);
  EXPECT_EQ(p.tail, p.head + 3 * kMiB);
  EXPECT_EQ(p.last, p.head + 4 * kMiB);
  EXPECT_TRUE(a.device->FillHost(p.second, kMiB, 0xB2).ok());
  EXPECT_TRUE(a.device->FillHost(p.third, kMiB, 0xC3).ok());
  EXPECT_TRUE(a.device->FillHost(p.last, 2 * kMiB, 0xE5).ok());
  EXPECT_TRUE(a->Free(p.head).ok());
  EXPECT_TRUE(a->Free(p.tail).ok());
  return p;
}

bool Holds(SimulatedAllocator& a, DeviceAddress address, uint64_t bytes, uint8_t value) {
  absl::StatusOr<bool> equal = a.device->HostEquals(address, bytes, value);
  EXPECT_TRUE(equal.ok()) << equal.status();
  return equal.ok() && *equal;
}

TEST(StitchedBlocks, ServeWhatOnlyPiecesOfPagesHold) {
  auto plain = Device(/*stitch=*/false);
  FreeTwoPieces(plain);
  absl::StatusOr<DeviceAddress> refused = plain->Allocate(2 * kMiB);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);

  auto a = Device(/*stitch=*/true);
  const Pieces p = FreeTwoPieces(a);
  const uint64_t maps = a.device->CallCount(BackendCall::kMap);
  absl::StatusOr<DeviceAddress> stitched = a->Allocate(2 * kMiB);
  ASSERT_TRUE(stitched.ok()) << stitched.status();
  HEADROOM_EXPECT_VALID(a);
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.num_stitched_blocks, 1);
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, static_cast<int64_t>(6 * kMiB));  // no new memory
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(s.allocation[kAllPools].current, 4);  // three blocks and the stitched one
  EXPECT_EQ(a.device->CallCount(BackendCall::kMap), maps + 2);  // page 1, then page 0
  absl::StatusOr<BlockInfo> info = a->Lookup(*stitched);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, 2 * kMiB);

  // Its first MiB is the tail of page 1, its second the head of page 0; the live blocks keep their bytes.
  ASSERT_TRUE(a.device->FillHost(*stitched, kMiB, 0x71).ok());
  ASSERT_TRUE(a.device->FillHost(*stitched + kMiB, kMiB, 0x72).ok());
  EXPECT_TRUE(Holds(a, p.tail, kMiB, 0x71));
  EXPECT_TRUE(Holds(a, p.head, kMiB, 0x72));
  EXPECT_TRUE(Holds(a, p.second, kMiB, 0xB2));
  EXPECT_TRUE(Holds(a, p.third, kMiB, 0xC3));
  EXPECT_TRUE(Holds(a, p.last, 2 * kMiB, 0xE5));

  // Freed, and its free completed: the range is unmapped and the pieces serve again.
  ASSERT_TRUE(a->Free(*stitched).ok());
  EXPECT_THAT(std::string(a->Free(*stitched).message()), HasSubstr("double free"));
  ASSERT_TRUE(a->EmptyCache().ok());
  HEADROOM_EXPECT_VALID(a);
  s = a->GetStats();
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(s.num_pages_unmapped, 2);
  EXPECT_EQ(*a->Allocate(kMiB), p.head);
  EXPECT_EQ(*a->Allocate(kMiB), p.tail);
  HEADROOM_EXPECT_VALID(a);
}

// A tail and a new page: a 1 MiB free tail of page 0, a live 2 MiB block on
// page 1 and one page left. 2.5 MiB take the tail and 1.5 MiB of the new
// page; the rest of that page stays cached.
TEST(StitchedBlocks, TakeATailAndNewPages) {
  auto a = Device(/*stitch=*/true);
  const DeviceAddress first = *a->Allocate(kMiB);
  const DeviceAddress tail = *a->Allocate(kMiB);
  const DeviceAddress live = *a->Allocate(2 * kMiB);
  ASSERT_TRUE(a.device->FillHost(first, kMiB, 0x11).ok());
  ASSERT_TRUE(a.device->FillHost(live, 2 * kMiB, 0x22).ok());
  ASSERT_TRUE(a->Free(tail).ok());
  absl::StatusOr<DeviceAddress> stitched = a->Allocate(5 * kMiB / 2);
  ASSERT_TRUE(stitched.ok()) << stitched.status();
  HEADROOM_EXPECT_VALID(a);
  MemoryStats s = a->GetStats();
  EXPECT_EQ(s.num_stitched_blocks, 1);
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(s.total_free_bytes, kMiB / 2);
  ASSERT_TRUE(a.device->FillHost(*stitched, 5 * kMiB / 2, 0x33).ok());
  EXPECT_TRUE(Holds(a, tail, kMiB, 0x33));
  EXPECT_TRUE(Holds(a, first, kMiB, 0x11));
  EXPECT_TRUE(Holds(a, live, 2 * kMiB, 0x22));
  ASSERT_TRUE(a->Free(*stitched).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  HEADROOM_EXPECT_VALID(a);
  EXPECT_EQ(a->GetStats().reserved_bytes[kAllPools].current, static_cast<int64_t>(4 * kMiB));
}

// In a snapshot the caller's block is a segment of its own, mapped before its
// alloc and unmapped after its free; its pieces are neither free nor counted
// as allocations of their segments, so memory_viz draws every event.
TEST(StitchedBlocks, ShowInSnapshotsAsASegmentOfTheirOwn) {
  auto a = Device(/*stitch=*/true);
  a->SetHistoryCapacity(100);
  ASSERT_TRUE(a->Allocate(kMiB).ok());
  const DeviceAddress tail = *a->Allocate(kMiB);
  ASSERT_TRUE(a->Allocate(2 * kMiB).ok());
  ASSERT_TRUE(a->Free(tail).ok());
  const DeviceAddress stitched = *a->Allocate(5 * kMiB / 2);

  nlohmann::json snapshot = SnapshotToJson(a->TakeSnapshot());
  EXPECT_EQ(testing::DrawableByMemoryViz(snapshot, /*history_from_start=*/true), absl::OkStatus());
  uint64_t allocated = 0;
  uint64_t pieces = 0;
  int stitched_segments = 0;
  for (const nlohmann::json& segment : snapshot["segments"]) {
    if (segment.value("is_stitched", false)) {
      ++stitched_segments;
      EXPECT_EQ(segment["address"], stitched);
      EXPECT_EQ(segment["total_size"], 5 * kMiB / 2);
      ASSERT_EQ(segment["blocks"].size(), 1u);
      EXPECT_EQ(segment["blocks"][0]["state"], "active_allocated");
      continue;
    }
    allocated += segment["allocated_size"].get<uint64_t>();
    for (const nlohmann::json& block : segment["blocks"]) {
      if (block["state"] == "stitched_part") pieces += block["size"].get<uint64_t>();
    }
  }
  EXPECT_EQ(stitched_segments, 1);
  EXPECT_EQ(allocated, 3 * kMiB);  // the blocks of 1 and 2 MiB
  EXPECT_EQ(pieces, 5 * kMiB / 2);  // the tail and 1.5 MiB of a new page

  // Freed, it waits for its stream (an event), then its range goes; memory_viz draws both states.
  ASSERT_TRUE(a->Free(stitched).ok());
  snapshot = SnapshotToJson(a->TakeSnapshot());
  EXPECT_EQ(testing::DrawableByMemoryViz(snapshot, /*history_from_start=*/true), absl::OkStatus());
  ASSERT_TRUE(a->EmptyCache().ok());
  snapshot = SnapshotToJson(a->TakeSnapshot());
  EXPECT_EQ(testing::DrawableByMemoryViz(snapshot, /*history_from_start=*/true), absl::OkStatus());
  for (const nlohmann::json& segment : snapshot["segments"]) EXPECT_FALSE(segment.contains("is_stitched"));
  std::vector<std::string> actions;
  for (const nlohmann::json& e : snapshot["device_traces"][0]) {
    if (e["addr"] == stitched) actions.push_back(e["action"]);
  }
  EXPECT_THAT(actions, ElementsAre("segment_map", "alloc", "free_requested", "free_completed", "segment_unmap"));
}

// With the two pieces, 4 MiB need two new pages more, and the device has
// none: the pieces go back and the request fails as without stitching.
TEST(StitchedBlocks, NotWhereTheDeviceHasNoRoomForTheRest) {
  auto a = Device(/*stitch=*/true);
  FreeTwoPieces(a);
  absl::StatusOr<DeviceAddress> refused = a->Allocate(4 * kMiB + 512);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a->GetStats().num_stitched_blocks, 0);
  HEADROOM_EXPECT_VALID(a);
  EXPECT_TRUE(a->Allocate(2 * kMiB).ok());  // the pieces are free as before
}

// The range is unmapped only once every stream that used the block is done,
// its own included: until then its pieces stay allocated. A fourth page, free
// by then, serves the calls that poll the frees.
TEST(StitchedBlocks, UnmappedOnlyAfterTheirStreams) {
  auto a = Device(/*stitch=*/true, /*pages=*/4, /*auto_complete_events=*/false);
  const StreamHandle other = *a.device->CreateStream();
  FreeTwoPieces(a);
  const DeviceAddress fourth = *a->Allocate(2 * kMiB);
  const DeviceAddress stitched = *a->Allocate(2 * kMiB);
  EXPECT_EQ(a->GetStats().num_stitched_blocks, 1);
  ASSERT_TRUE(a->Free(fourth).ok());
  ASSERT_TRUE(a->RecordStream(stitched, other).ok());
  const uint64_t unmaps = a.device->CallCount(BackendCall::kUnmap);
  ASSERT_TRUE(a->Free(stitched).ok());
  for (StreamHandle done : {other, kDefaultStream}) {
    ASSERT_TRUE(a->Allocate(512).ok());  // polls the frees: `done` runs on
    EXPECT_EQ(a.device->CallCount(BackendCall::kUnmap), unmaps);
    HEADROOM_EXPECT_VALID(a);
    a.device->CompleteStream(done);
  }
  ASSERT_TRUE(a->Allocate(512).ok());
  EXPECT_EQ(a.device->CallCount(BackendCall::kUnmap), unmaps + 1);
  HEADROOM_EXPECT_VALID(a);
}

// A device refusal while stitching leaves the pieces free; one while
// unmapping keeps the block out of use.
TEST(StitchedBlocks, DeviceRefusalsLeaveAConsistentState) {
  auto a = Device(/*stitch=*/true);
  const Pieces p = FreeTwoPieces(a);
  a.device->InjectFailure(BackendCall::kMap, {.skip = 1});
  EXPECT_EQ(a->Allocate(2 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
  HEADROOM_EXPECT_VALID(a);
  EXPECT_EQ(a->GetStats().allocated_bytes[kAllPools].current, static_cast<int64_t>(4 * kMiB));
  EXPECT_TRUE(Holds(a, p.second, kMiB, 0xB2));

  // Any other refusal too: stitching is a last resort, and the request is out of memory as without it.
  a.device->InjectFailure(BackendCall::kMap, {.code = absl::StatusCode::kInternal});
  EXPECT_EQ(a->Allocate(2 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
  HEADROOM_EXPECT_VALID(a);

  const DeviceAddress stitched = *a->Allocate(2 * kMiB);
  a.device->InjectFailure(BackendCall::kUnmap, {.code = absl::StatusCode::kInternal});
  ASSERT_TRUE(a->Free(stitched).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  HEADROOM_EXPECT_VALID(a);
  const MemoryStats s = a->GetStats();
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(s.active_bytes[kAllPools].current, static_cast<int64_t>(6 * kMiB));  // kept out of use
  EXPECT_EQ(a->Allocate(kMiB).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(StitchedBlocks, NeedExpandableSegments) {
  auto device = *SimulatedBackend::Create({});
  auto r = CachingAllocator::Create(device.get(), {.stitch_pages = true});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace headroom
