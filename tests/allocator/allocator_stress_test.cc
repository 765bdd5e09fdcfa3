// Deterministic randomized stress: many seeds, every option combination,
// Validate() after every operation, and host-backed memory with a byte
// pattern per live allocation so that overlapping blocks are caught.
#include <random>
#include <thread>

#include "allocator/alloc_conf.h"
#include "allocator/caching_allocator.h"
#include "common/units.h"
#include "gtest/gtest.h"
#include "tests/allocator/allocator_test_util.h"
#include "tests/allocator/memory_viz_model.h"

namespace headroom {
namespace {

using ::headroom::testing::MakeAllocator;
using ::headroom::testing::SimulatedAllocator;

struct StressCase {
  const char* name;
  AllocatorOptions options;
};

// gtest lists parameters with the test names; print the case's name rather
// than its bytes, which include a pointer and so differ from run to run.
void PrintTo(const StressCase& c, std::ostream* os) { *os << c.name; }

class AllocatorStress : public ::testing::TestWithParam<StressCase> {};

uint64_t RandomSize(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: return 1 + rng() % kMiB;                   // small pool
    case 1: return kMiB + rng() % (9 * kMiB);           // large, 20 MiB segments
    case 2: return 10 * kMiB + rng() % (20 * kMiB);     // large, own segments
    default: return 512 * (1 + rng() % 64);             // many equal small sizes
  }
}

// A live allocation and the byte pattern written into it when it was made.
struct Live {
  DeviceAddress address;
  uint64_t size;
  uint8_t pattern;
};

// Writes a random pattern into a new allocation and tracks it.
::testing::AssertionResult Track(SimulatedAllocator& a, std::mt19937_64& rng, DeviceAddress address, uint64_t size,
                                 std::vector<Live>& live) {
  const auto pattern = static_cast<uint8_t>(1 + rng() % 250);
  const absl::Status filled = a.device->FillHost(address, size, pattern, kMinBlockSize);
  if (!filled.ok()) return ::testing::AssertionFailure() << filled;
  live.push_back({address, size, pattern});
  return ::testing::AssertionSuccess();
}

// Nobody wrote over the allocation while it was live.
::testing::AssertionResult Intact(SimulatedAllocator& a, const Live& l) {
  absl::StatusOr<bool> intact = a.device->HostEquals(l.address, l.size, l.pattern, kMinBlockSize);
  if (!intact.ok()) return ::testing::AssertionFailure() << intact.status();
  if (!*intact) return ::testing::AssertionFailure() << "allocation at 0x" << std::hex << l.address << " was overwritten";
  return ::testing::AssertionSuccess();
}

// Frees what is live, lets every stream finish and empties the cache.
void Drain(SimulatedAllocator& a, const std::vector<Live>& live) {
  for (const Live& l : live) ASSERT_TRUE(a->Free(l.address).ok());
  a.device->CompleteAll();
  ASSERT_TRUE(a->EmptyCache().ok());
  HEADROOM_EXPECT_VALID(a);
}

TEST_P(AllocatorStress, InvariantsHoldAfterEveryOperation) {
  int64_t stitched = 0;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    auto a = MakeAllocator({.capacity_bytes = 256 * kMiB, .auto_complete_events = false, .host_backing = true},
                           GetParam().options);
    a->SetHistoryCapacity(1 << 20);  // the whole run: memory_viz must draw it at every event
    std::mt19937_64 rng(seed);
    std::vector<StreamHandle> streams = {kDefaultStream, *a.device->CreateStream(), *a.device->CreateStream()};
    std::vector<Live> live;
    int ooms = 0;
    for (int step = 0; step < 500; ++step) {
      const uint64_t op = rng() % 100;
      if (op < 50 || live.empty()) {
        const uint64_t size = RandomSize(rng);
        const StreamHandle stream = streams[rng() % streams.size()];
        absl::StatusOr<DeviceAddress> p = a->Allocate(size, stream);
        if (!p.ok()) {
          ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
          ++ooms;
        } else {
          ASSERT_TRUE(Track(a, rng, *p, size, live));
        }
      } else if (op < 85) {
        const size_t i = rng() % live.size();
        ASSERT_TRUE(Intact(a, live[i]));
        if (rng() % 4 == 0) {
          ASSERT_TRUE(a->RecordStream(live[i].address, streams[rng() % streams.size()]).ok());
        }
        ASSERT_TRUE(a->Free(live[i].address, live[i].size).ok());
        live[i] = live.back();
        live.pop_back();
      } else if (op < 93) {
        a.device->CompleteStream(streams[rng() % streams.size()]);
      } else if (op < 96) {
        ASSERT_TRUE(a->EmptyCache().ok());
      } else if (op < 98) {
        a->ResetPeakStats();
      } else {
        // A transient device error must leave everything consistent.
        a.device->InjectFailure(rng() % 2 ? BackendCall::kMalloc : BackendCall::kMap,
                                {.code = absl::StatusCode::kInternal});
        const uint64_t size = RandomSize(rng);
        absl::StatusOr<DeviceAddress> p = a->Allocate(size);
        a.device->ClearFailures();
        if (p.ok()) {  // served from the cache, no device call needed
          ASSERT_TRUE(a.device->FillHost(*p, size, 255, kMinBlockSize).ok());
          live.push_back({*p, size, 255});
        }
      }
      const absl::Status valid = a->Validate();
      ASSERT_TRUE(valid.ok()) << "step " << step << ": " << valid;
    }
    stitched += a->GetStats().num_stitched_blocks;
    EXPECT_EQ(testing::DrawableByMemoryViz(SnapshotToJson(a->TakeSnapshot()), /*history_from_start=*/true),
              absl::OkStatus());
    ASSERT_NO_FATAL_FAILURE(Drain(a, live));
    EXPECT_EQ(testing::DrawableByMemoryViz(SnapshotToJson(a->TakeSnapshot()), /*history_from_start=*/true),
              absl::OkStatus());
    if (a->GetStats().reserved_bytes[kAllPools].current != 0) {
      ADD_FAILURE() << SnapshotToJson(a->TakeSnapshot())["segments"].dump();
    }
    EXPECT_EQ(a->GetStats().reserved_bytes[kAllPools].current, 0);
    EXPECT_EQ(a.device->used_bytes(), 0u);
  }
  // Note [Stitched blocks]: the runs out of memory include some that stitching serves, checked here too.
  if (GetParam().options.stitch_pages) {
    EXPECT_GT(stitched, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, AllocatorStress,
    ::testing::Values(StressCase{"defaults", {}},
                      StressCase{"max_split", {.max_split_size = 32 * kMiB}},
                      StressCase{"power2", {.rounding = {.power2_divisions = 4}}},
                      StressCase{"gc", {.garbage_collection_threshold = 0.6}},
                      StressCase{"expandable", {.expandable_segments = true}},
                      StressCase{"expandable_max_split", {.max_split_size = 32 * kMiB, .expandable_segments = true}},
                      StressCase{"cross_stream", {.cross_stream_reuse = true}},
                      StressCase{"cross_stream_expandable", {.expandable_segments = true, .cross_stream_reuse = true}},
                      // Headroom's policy (the "headroom" preset): pages move between pools and streams.
                      StressCase{"moving_pages", {.expandable_segments = true,
                                                  .expandable_large_page_bytes = 2 * kMiB,
                                                  .move_free_pages = true}},
                      StressCase{"moving_pages_cross_stream", {.expandable_segments = true,
                                                               .expandable_large_page_bytes = 2 * kMiB,
                                                               .cross_stream_reuse = true,
                                                               .move_free_pages = true}},
                      // Small blocks in the large pool's pages, and pages moved within one pool (Note [One pool]).
                      StressCase{"unified_moving", {.expandable_segments = true,
                                                    .expandable_large_page_bytes = 2 * kMiB,
                                                    .move_free_pages = true,
                                                    .unified_pool = true}},
                      StressCase{"headroom_preset", *ParseAllocConf(ResolveAllocConfPreset("headroom"))},
                      StressCase{"fraction_history", {.memory_fraction = 0.7, .history_entries = 64}}),
    [](const ::testing::TestParamInfo<StressCase>& param) { return std::string(param.param.name); });

// Every backend call, made to fail at random moments: each operation then
// succeeds or returns an error, the invariants hold after it, live
// allocations keep their contents, and once the failures stop everything can
// be freed and returned to the device. The exceptions by design: a free
// that can neither record an event nor wait for a stream quarantines its
// block, whose segment then stays reserved, and so does a stitched block
// whose range the device will not unmap.
class EveryBackendCallFails : public ::testing::TestWithParam<BackendCall> {};

TEST_P(EveryBackendCallFails, WithoutCorruptionOrLeaks) {
  const BackendCall failing = GetParam();
  enum class Policy { kDefault, kExpandable, kMovingPages, kHeadroom };
  for (Policy policy : {Policy::kDefault, Policy::kExpandable, Policy::kMovingPages, Policy::kHeadroom}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << ", policy " << static_cast<int>(policy));
      AllocatorOptions options{.expandable_segments = policy != Policy::kDefault,
                               .cross_stream_reuse = seed % 2 == 0,
                               .move_free_pages = policy == Policy::kMovingPages};
      if (policy == Policy::kHeadroom) options = *ParseAllocConf(ResolveAllocConfPreset("headroom"));
      auto a = MakeAllocator({.capacity_bytes = 256 * kMiB, .auto_complete_events = false, .host_backing = true},
                             options);
      std::mt19937_64 rng(seed);
      std::vector<StreamHandle> streams = {kDefaultStream, *a.device->CreateStream(), *a.device->CreateStream()};
      std::vector<Live> live;
      size_t quarantined = 0;
      for (int step = 0; step < 300; ++step) {
        if (rng() % 3 == 0) {
          a.device->InjectFailure(failing, {.skip = static_cast<int>(rng() % 3), .code = absl::StatusCode::kInternal});
        }
        const uint64_t op = rng() % 100;
        if (op < 50 || live.empty()) {
          const uint64_t size = RandomSize(rng);
          absl::StatusOr<DeviceAddress> p = a->Allocate(size, streams[rng() % streams.size()]);
          if (p.ok()) {
            ASSERT_TRUE(Track(a, rng, *p, size, live));
          }
        } else if (op < 85) {
          const size_t i = rng() % live.size();
          ASSERT_TRUE(Intact(a, live[i]));
          if (rng() % 3 == 0) (void)a->RecordStream(live[i].address, streams[rng() % streams.size()]);
          const absl::Status freed = a->Free(live[i].address, live[i].size);
          if (!freed.ok()) {
            ASSERT_NE(freed.message().find("kept out of use"), std::string_view::npos) << freed;
            ++quarantined;
          }
          live[i] = live.back();
          live.pop_back();
        } else if (op < 93) {
          a.device->CompleteStream(streams[rng() % streams.size()]);
        } else {
          (void)a->EmptyCache();
        }
        a.device->ClearFailures();
        const absl::Status valid = a->Validate();
        ASSERT_TRUE(valid.ok()) << "step " << step << ": " << valid;
      }
      ASSERT_NO_FATAL_FAILURE(Drain(a, live));
      const MemoryStats stats = a->GetStats();
      EXPECT_EQ(stats.allocated_bytes[kAllPools].current, 0);
      // Kept out of use: the blocks whose free failed, and stitched blocks whose range the device would not
      // unmap once their free completed (Note [Stitched blocks]; their free itself succeeded).
      const int64_t kept = stats.active[kAllPools].current;
      EXPECT_GE(kept, static_cast<int64_t>(quarantined));
      EXPECT_LE(kept - static_cast<int64_t>(quarantined), stats.num_stitched_blocks);
      if (kept == 0) {
        EXPECT_EQ(stats.reserved_bytes[kAllPools].current, 0);
        EXPECT_EQ(a.device->used_bytes(), 0u);
      } else {
        EXPECT_LE(stats.segment[kAllPools].current, kept);
      }
    }
  }
}

std::vector<BackendCall> AllBackendCalls() {
  std::vector<BackendCall> calls;
  for (size_t i = 0; i < kBackendCallCount; ++i) calls.push_back(static_cast<BackendCall>(i));
  return calls;
}

INSTANTIATE_TEST_SUITE_P(Calls, EveryBackendCallFails, ::testing::ValuesIn(AllBackendCalls()),
                         [](const ::testing::TestParamInfo<BackendCall>& param) {
                           return std::string(BackendCallName(param.param));
                         });

TEST(AllocatorThreads, ConcurrentAllocateFreeStaysConsistent) {
  for (bool expandable : {false, true}) {
    auto a = MakeAllocator({.capacity_bytes = 4 * kGiB}, {.expandable_segments = expandable});
    constexpr int kThreads = 4;
    std::vector<StreamHandle> streams;
    for (int t = 0; t < kThreads; ++t) streams.push_back(*a.device->CreateStream());
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<uint64_t>(t) + 100);
        std::vector<DeviceAddress> mine;
        for (int i = 0; i < 20000; ++i) {
          if (mine.empty() || rng() % 2 == 0) {
            // Half the threads share the default stream.
            const StreamHandle stream = t % 2 == 0 ? kDefaultStream : streams[static_cast<size_t>(t)];
            auto p = a->Allocate(RandomSize(rng) / 8 + 1, stream);
            if (p.ok()) {
              mine.push_back(*p);
            } else {
              ++failures;
            }
          } else {
            const size_t k = rng() % mine.size();
            // Sometimes another stream used it: the free is deferred to an event.
            if (rng() % 8 == 0 && !a->RecordStream(mine[k], streams[rng() % streams.size()]).ok()) ++failures;
            if (!a->Lookup(mine[k]).ok() || !a->Free(mine[k]).ok()) ++failures;
            mine[k] = mine.back();
            mine.pop_back();
          }
          if (i % 500 == 0) (void)a->GetStats();
        }
        for (DeviceAddress p : mine) {
          if (!a->Free(p).ok()) ++failures;
        }
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    HEADROOM_EXPECT_VALID(a);
    EXPECT_EQ(a->GetStats().allocated_bytes[kAllPools].current, 0);
    ASSERT_TRUE(a->EmptyCache().ok());
    EXPECT_EQ(a.device->used_bytes(), 0u);
  }
}

}  // namespace
}  // namespace headroom
