// Layout plan files (allocator/layout_plan.h) and Note [Following a layout
// plan] on the simulated device, whose host backing keeps each live block's
// bytes: a plan followed wrongly would show as one block overwriting another.
#include "allocator/layout_plan.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "allocator/alloc_conf.h"
#include "allocator/caching_allocator.h"
#include "common/checked_math.h"
#include "common/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/allocator/allocator_test_util.h"
#include "tests/allocator/memory_viz_model.h"

namespace headroom {
namespace {

using ::headroom::testing::MakeAllocator;
using ::headroom::testing::SimulatedAllocator;
using ::testing::HasSubstr;

std::shared_ptr<const LayoutPlan> Plan(std::vector<PlannedBlock> blocks, size_t repeat_from) {
  return std::make_shared<const LayoutPlan>(LayoutPlan{.blocks = std::move(blocks), .repeat_from = repeat_from});
}

// Headroom's policy, following `plan`, on a device of `pages` 2 MiB pages.
SimulatedAllocator Following(std::shared_ptr<const LayoutPlan> plan, uint64_t pages = 64,
                             bool auto_complete_events = true) {
  AllocatorOptions options = *ParseAllocConf(ResolveAllocConfPreset("headroom"));
  options.layout_plan = std::move(plan);
  return MakeAllocator(
      {.capacity_bytes = pages * 2 * kMiB, .auto_complete_events = auto_complete_events, .host_backing = true},
      options);
}

TEST(LayoutPlanFile, ReadsBackWhatItWrites) {
  const LayoutPlan plan{.blocks = {{0, 512}, {4 * kMiB, 3 * kMiB}, {1024, 2048}}, .repeat_from = 1};
  const absl::StatusOr<LayoutPlan> back = ParseLayoutPlan(LayoutPlanJson(plan), "p.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->blocks.size(), 3u);
  EXPECT_EQ(back->blocks[1].offset, 4 * kMiB);
  EXPECT_EQ(back->blocks[1].size, 3 * kMiB);
  EXPECT_EQ(back->repeat_from, 1u);
  EXPECT_EQ(back->extent_bytes(), 7 * kMiB);
  // Allocations 3, 4, 5 repeat blocks 1, 2, 1.
  EXPECT_EQ(back->At(3), &back->blocks[1]);
  EXPECT_EQ(back->At(4), &back->blocks[2]);
  EXPECT_EQ(back->At(5), &back->blocks[1]);
  const LayoutPlan once{.blocks = {{0, 512}}, .repeat_from = 1};
  EXPECT_EQ(once.At(1), nullptr);
}

TEST(LayoutPlanFile, NamesTheFieldAtFault) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {
           Case{"[]", "expected a JSON object"},
           Case{R"({"format": "other", "version": 1, "repeat_from": 0, "blocks": [[0, 512]]})", "format"},
           Case{R"({"format": "headroom.layout_plan", "version": 2, "repeat_from": 0, "blocks": [[0, 512]]})",
                "version"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 0, "blocks": {}})", "blocks"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 0, "blocks": []})",
                "1 to 16777216 blocks"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 0, "blocks": [[0]]})",
                "blocks[0]"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 0, "blocks": [[0, -512]]})",
                "blocks[0][1]"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 0, "blocks": [[0, 512], [7, 512]]})",
                "blocks[1] at offset 7"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 0, "blocks": [[0, 0]]})",
                "blocks[0]"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 0,
                    "blocks": [[4611686018427387904, 512]]})",
                "blocks[0]"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 2, "blocks": [[0, 512]]})",
                "repeat_from 2"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "blocks": [[0, 512]]})", "repeat_from"},
           // As written, not as clamped (once shown as 16777217) or as a double.
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 18446744073709551615,
                    "blocks": [[0, 512]]})",
                "repeat_from 18446744073709551615 is past the plan's 1 blocks"},
           Case{R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 18446744073709551616,
                    "blocks": [[0, 512]]})",
                "repeat_from: 18446744073709551616 is too large an integer"},
       }) {
    SCOPED_TRACE(c.text);
    const absl::StatusOr<LayoutPlan> plan = ParseLayoutPlan(c.text, "bad.plan.json");
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), HasSubstr("bad.plan.json"));
    EXPECT_THAT(plan.status().message(), HasSubstr(c.says));
  }
}

// A layout plan file has the bound of a recorded trace (Note [Input bounds]
// in common/input_file.h): past it (a sparse file, no disk blocks) it is
// refused before it is read, naming the kind and the bound.
TEST(LayoutPlanFile, IsBoundedLikeARecordedTrace) {
  const std::string path = ::testing::TempDir() + "/huge.plan.json";
  std::ofstream(path) << "{}";
  std::filesystem::resize_file(path, kLayoutPlanFile.max_bytes + 1);
  const absl::StatusOr<LayoutPlan> plan = ReadLayoutPlanFile(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(), path + ": 1073741825 bytes is more than the 1.00 GiB a layout plan may have");
}

TEST(LayoutPlanFile, TheAllocatorReadsTheFileItsConfNames) {
  const absl::StatusOr<AllocatorOptions> options =
      ParseAllocConf(ResolveAllocConfPreset("headroom,layout_plan:/no/such/plan.json"));
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->layout_plan_file, "/no/such/plan.json");
  EXPECT_TRUE(options->unified_pool);  // the preset's keys, then the plan
  EXPECT_THAT(FormatAllocConf(*options), HasSubstr(",layout_plan:/no/such/plan.json"));
  // A key the preset sets already is given twice.
  EXPECT_FALSE(ParseAllocConf(ResolveAllocConfPreset("headroom,unified_pool:False")).ok());
  EXPECT_FALSE(ParseAllocConf("layout_plan:").ok());

  auto device = *SimulatedBackend::Create({});
  const absl::StatusOr<std::unique_ptr<CachingAllocator>> missing = CachingAllocator::Create(device.get(), *options);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("layout_plan"));
  EXPECT_THAT(missing.status().message(), HasSubstr("/no/such/plan.json"));
  const std::string path = ::testing::TempDir() + "/layout_plan_test.plan.json";
  {
    std::ofstream file(path);
    file << LayoutPlanJson({.blocks = {{2 * kMiB, kMiB}}, .repeat_from = 0});
  }
  AllocatorOptions from_file = *options;
  from_file.layout_plan_file = path;
  const absl::StatusOr<std::unique_ptr<CachingAllocator>> a = CachingAllocator::Create(device.get(), from_file);
  ASSERT_TRUE(a.ok()) << a.status();
  const DeviceAddress first = *(*a)->Allocate(kMiB);
  const DeviceAddress second = *(*a)->Allocate(kMiB - 100);  // the one block again, rounded to the same size
  EXPECT_EQ((*a)->GetStats().num_planned_allocs, 1);  // the second overlaps the first, still live
  EXPECT_THAT((*a)->PlanDeparture(), HasSubstr("request 1"));
  EXPECT_NE(first, second);
  // A plan given in code is checked as a file is.
  AllocatorOptions bad = *options;
  bad.layout_plan = Plan({{100, 512}}, 0);
  EXPECT_EQ(CachingAllocator::Create(device.get(), bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FollowingAPlan, PutsEachRequestWhereThePlanSaysAndRepeatsItsStep) {
  // A 3 MiB block that lives throughout, then a step: 1 MiB and 2 MiB blocks on top of it, freed by its end.
  auto a = Following(Plan({{0, 3 * kMiB}, {3 * kMiB, kMiB}, {4 * kMiB, 2 * kMiB}}, 1));
  const DeviceAddress weights = *a->Allocate(3 * kMiB);
  for (int step = 0; step < 4; ++step) {
    const DeviceAddress x = *a->Allocate(kMiB);
    const DeviceAddress y = *a->Allocate(2 * kMiB - 500);
    EXPECT_EQ(x, weights + 3 * kMiB);
    EXPECT_EQ(y, weights + 4 * kMiB);
    EXPECT_EQ(a->Lookup(y)->requested_size, 2 * kMiB - 500);
    HEADROOM_EXPECT_VALID(a);
    ASSERT_TRUE(a->Free(y).ok());
    ASSERT_TRUE(a->Free(x).ok());
    HEADROOM_EXPECT_VALID(a);
  }
  const MemoryStats stats = a->GetStats();
  EXPECT_EQ(stats.num_planned_allocs, 9);
  EXPECT_EQ(a->PlanDeparture(), "");
  // Three pages, mapped in the first step and kept: no map after it.
  EXPECT_EQ(stats.num_pages_mapped, 3);
  EXPECT_EQ(stats.reserved_bytes[kAllPools].current, static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(stats.allocated_bytes[kAllPools].current, static_cast<int64_t>(3 * kMiB));
  EXPECT_EQ(stats.segment[kAllPools].current, 1);
  // The free pages go back with the cache; the range's live one stays.
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(a->GetStats().reserved_bytes[kAllPools].current, static_cast<int64_t>(4 * kMiB));
  HEADROOM_EXPECT_VALID(a);
  const nlohmann::json snapshot = SnapshotToJson(a->TakeSnapshot());
  ASSERT_EQ(snapshot["segments"].size(), 1u);
  EXPECT_EQ(snapshot["segments"][0]["is_planned"], true);
  EXPECT_EQ(snapshot["segments"][0]["total_size"], 4 * kMiB);
  EXPECT_EQ(snapshot["segments"][0]["allocated_size"], 3 * kMiB);
  ASSERT_TRUE(a->Free(weights).ok());
}

TEST(FollowingAPlan, LeavesItForGoodWhereTheJobDiffers) {
  struct Case {
    const char* name;
    const char* says;
  };
  for (const Case& c : {Case{"size", "request 1 asks for 3145728 bytes; the plan has 2097152"},
                        Case{"stream", "request 1 is on stream"},
                        Case{"in use", "still holds a block at +0 not yet freed"},
                        Case{"end", "the plan ends after 2 requests"}}) {
    SCOPED_TRACE(c.name);
    // The plan's second block reuses the first one's range: the recorded run freed the first before it.
    auto a = Following(Plan({{0, 2 * kMiB}, {0, 2 * kMiB}}, 2));
    const StreamHandle other = *a.device->CreateStream();
    const DeviceAddress first = *a->Allocate(2 * kMiB);
    ASSERT_TRUE(a.device->FillHost(first, 2 * kMiB, 7, kMinBlockSize).ok());
    const std::string name = c.name;
    if (name != "in use") {
      ASSERT_TRUE(a->Free(first).ok());
    }
    DeviceAddress second = 0;
    if (name == "end") second = *a->Allocate(2 * kMiB);
    const uint64_t size = name == "size" ? 3 * kMiB : 2 * kMiB;
    const absl::StatusOr<DeviceAddress> departing = a->Allocate(size, name == "stream" ? other : kDefaultStream);
    ASSERT_TRUE(departing.ok()) << departing.status();  // the policy serves it
    EXPECT_THAT(a->PlanDeparture(), HasSubstr(c.says));
    HEADROOM_EXPECT_VALID(a);
    if (name == "in use") {
      EXPECT_NE(*departing, first);
      EXPECT_TRUE(*a.device->HostEquals(first, 2 * kMiB, 7, kMinBlockSize));
      ASSERT_TRUE(a->Free(first).ok());
    }
    // From then on the policy serves every request, and what was planned is freed as usual.
    const int64_t planned = a->GetStats().num_planned_allocs;
    const DeviceAddress later = *a->Allocate(2 * kMiB);
    EXPECT_EQ(a->GetStats().num_planned_allocs, planned);
    ASSERT_TRUE(a->Free(later).ok());
    ASSERT_TRUE(a->Free(*departing).ok());
    ASSERT_TRUE(a->Free(second).ok());
    HEADROOM_EXPECT_VALID(a);
    ASSERT_TRUE(a->EmptyCache().ok());
    EXPECT_EQ(a->GetStats().reserved_bytes[kAllPools].current, 0);
    EXPECT_EQ(a->GetStats().segment[kAllPools].current, 0);  // the departed plan's range went back too
    HEADROOM_EXPECT_VALID(a);
  }
}

TEST(FollowingAPlan, WithoutAnAddressRangeThePolicyServesTheJob) {
  auto a = Following(Plan({{0, 2 * kMiB}}, 0));
  a.device->InjectFailure(BackendCall::kReserveAddressRange, {.code = absl::StatusCode::kResourceExhausted});
  const absl::StatusOr<DeviceAddress> p = a->Allocate(2 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(a->PlanDeparture(), HasSubstr("request 0: the plan's address range of 2.00 MiB could not be reserved"));
  EXPECT_EQ(a->GetStats().num_planned_allocs, 0);
  HEADROOM_EXPECT_VALID(a);
  ASSERT_TRUE(a->Free(*p).ok());
  // A plan whose range is past twice the device (a block at 2^61) is no plan for it: the policy serves the job.
  auto absurd = Following(Plan({{uint64_t{1} << 61, 512}}, 0));
  ASSERT_TRUE(absurd->Allocate(512).ok());
  EXPECT_THAT(absurd->PlanDeparture(), HasSubstr("request 0: the plan's address range of"));
  EXPECT_THAT(absurd->PlanDeparture(), HasSubstr("is more than twice the device's 128.00 MiB"));
  HEADROOM_EXPECT_VALID(absurd);
}

TEST(FollowingAPlan, ABlockAnotherStreamStillUsesKeepsItsRange) {
  auto a = Following(Plan({{0, 2 * kMiB}, {0, 2 * kMiB}}, 2), 64, /*auto_complete_events=*/false);
  const StreamHandle other = *a.device->CreateStream();
  const DeviceAddress first = *a->Allocate(2 * kMiB);
  ASSERT_TRUE(a->RecordStream(first, other).ok());
  ASSERT_TRUE(a->Free(first).ok());  // pending until `other` is done
  EXPECT_THAT(a->Free(first).message(), HasSubstr("double free"));
  const DeviceAddress second = *a->Allocate(2 * kMiB);
  EXPECT_NE(second, first);
  EXPECT_THAT(a->PlanDeparture(), HasSubstr("waiting for other streams"));
  HEADROOM_EXPECT_VALID(a);
  a.device->CompleteAll();
  ASSERT_TRUE(a->Free(second).ok());
  ASSERT_TRUE(a->EmptyCache().ok());  // completes the pending free too
  HEADROOM_EXPECT_VALID(a);
  EXPECT_EQ(a->GetStats().active[kAllPools].current, 0);
  EXPECT_EQ(a->GetStats().reserved_bytes[kAllPools].current, 0);
}

TEST(FollowingAPlan, MovesAnUnusedPageWhereTheDeviceIsFull) {
  // Two pages of device. A block that lives throughout, then a step of two blocks never live together, the
  // first two pages above the second.
  auto a = Following(Plan({{0, 2 * kMiB}, {4 * kMiB, 2 * kMiB}, {2 * kMiB, 2 * kMiB}}, 1), 2);
  const DeviceAddress base = *a->Allocate(2 * kMiB);
  ASSERT_TRUE(a.device->FillHost(base, 2 * kMiB, 9, kMinBlockSize).ok());
  const DeviceAddress high = *a->Allocate(2 * kMiB);
  ASSERT_TRUE(a->Free(high).ok());
  // The device is full; page 2 is unused and moves to page 1.
  const DeviceAddress middle = *a->Allocate(2 * kMiB);
  EXPECT_EQ(middle, base + 2 * kMiB);
  EXPECT_EQ(a->GetStats().num_pages_unmapped, 1);
  EXPECT_EQ(a->GetStats().reserved_bytes[kAllPools].current, static_cast<int64_t>(4 * kMiB));
  EXPECT_TRUE(*a.device->HostEquals(base, 2 * kMiB, 9, kMinBlockSize));
  HEADROOM_EXPECT_VALID(a);
  // With both pages live, a request the plan has no room for is out of memory, and the plan still holds.
  const absl::StatusOr<DeviceAddress> none = a->Allocate(2 * kMiB);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted) << none.status();
  EXPECT_EQ(a->PlanDeparture(), "");
  HEADROOM_EXPECT_VALID(a);
  ASSERT_TRUE(a->Free(middle).ok());
  EXPECT_EQ(*a->Allocate(2 * kMiB), base + 4 * kMiB);  // the next planned block, after the failed request
  HEADROOM_EXPECT_VALID(a);
}

TEST(FollowingAPlan, KeepsItsPagesWhileTheDeviceHasRoom) {
  // Two blocks never live together, two pages apart: each step touches both pages, which stay mapped, even past
  // move_threshold's room (the plan's extent bounds them), so a steady loop maps nothing.
  AllocatorOptions options = *ParseAllocConf("expandable_segments:True,move_free_pages:True");
  options.layout_plan = Plan({{0, 2 * kMiB}, {4 * kMiB, 2 * kMiB}}, 0);
  auto a = MakeAllocator({.capacity_bytes = 80 * kGiB}, options);
  for (int step = 0; step < 3; ++step) {
    for (int block = 0; block < 2; ++block) {
      const DeviceAddress p = *a->Allocate(2 * kMiB);
      ASSERT_TRUE(a->Free(p).ok());
    }
  }
  HEADROOM_EXPECT_VALID(a);
  EXPECT_EQ(a->GetStats().num_planned_allocs, 6);
  EXPECT_EQ(a->GetStats().num_pages_mapped, 2);
  EXPECT_EQ(a->GetStats().num_pages_unmapped, 0);
  EXPECT_EQ(a->GetStats().reserved_bytes[kAllPools].peak, static_cast<int64_t>(4 * kMiB));
}

// A random run of steps: a prologue of blocks that live throughout, then a
// step of blocks freed by its end, played `steps` times; the plan places each
// block at the lowest offset free while it lives (first fit), as a plan of
// the run with every lifetime known does.
struct PlannedRun {
  struct Op {
    bool allocate;
    size_t id;  // the allocation, in order
    uint64_t size;
  };
  std::vector<Op> ops;
  LayoutPlan plan;
  uint64_t peak_page_bytes = 0;  // the most pages live planned blocks touch at once
};

PlannedRun MakePlannedRun(uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  PlannedRun run;
  std::map<uint64_t, uint64_t> live;  // offset -> size, of the plan
  std::vector<size_t> open;           // ids live in the step
  std::map<uint64_t, int> pages;      // page -> live blocks touching it
  auto touch = [&](const PlannedBlock& b, int by) {
    for (uint64_t p = b.offset / (2 * kMiB); p <= (b.offset + b.size - 1) / (2 * kMiB); ++p) {
      if ((pages[p] += by) == 0) pages.erase(p);
    }
    run.peak_page_bytes = std::max<uint64_t>(run.peak_page_bytes, pages.size() * 2 * kMiB);
  };
  auto allocate = [&](uint64_t size) {
    const uint64_t rounded = RoundUp(size, kMinBlockSize);
    uint64_t offset = 0;
    for (const auto& [at, bytes] : live) {
      if (at >= offset + rounded) break;
      offset = std::max(offset, at + bytes);
    }
    live[offset] = rounded;
    run.plan.blocks.push_back({offset, rounded});
    touch(run.plan.blocks.back(), 1);
    run.ops.push_back({true, run.plan.blocks.size() - 1, size});
    return run.plan.blocks.size() - 1;
  };
  auto free = [&](size_t slot) {
    const size_t id = open[slot];
    const PlannedBlock& b = run.plan.blocks[id];
    live.erase(b.offset);
    touch(b, -1);
    run.ops.push_back({false, id, 0});
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(slot));
  };
  auto size = [&] { return rng() % 3 == 0 ? 512 * (1 + rng() % 64) : 1 + rng() % (3 * kMiB); };
  for (int i = 0; i < 5; ++i) allocate(size());
  run.plan.repeat_from = run.plan.blocks.size();
  const std::vector<PlannedRun::Op> prologue = run.ops;
  for (int i = 0; i < 60; ++i) {
    if (open.empty() || rng() % 5 < 3) {
      open.push_back(allocate(size()));
    } else {
      free(rng() % open.size());
    }
  }
  while (!open.empty()) free(rng() % open.size());
  // Later steps repeat the first: the same sizes, the blocks of the step numbered anew.
  const std::vector<PlannedRun::Op> step(run.ops.begin() + static_cast<std::ptrdiff_t>(prologue.size()), run.ops.end());
  const size_t per_step = run.plan.blocks.size() - run.plan.repeat_from;
  for (int s = 1; s < steps; ++s) {
    for (PlannedRun::Op op : step) {
      op.id += static_cast<size_t>(s) * per_step;
      run.ops.push_back(op);
    }
  }
  return run;
}

// The run replayed on `a`, each block filled with its own byte and checked
// before its free; with `fail`, a backend call fails now and then, and a
// request that fails is made again. Returns the addresses of the blocks
// still live (the prologue's).
std::vector<std::pair<DeviceAddress, uint64_t>> Replay(SimulatedAllocator& a, const PlannedRun& run,
                                                       std::optional<BackendCall> fail, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::map<size_t, std::pair<DeviceAddress, uint64_t>> live;
  for (size_t i = 0; i < run.ops.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "op " << i);
    const PlannedRun::Op& op = run.ops[i];
    const auto pattern = static_cast<uint8_t>(1 + op.id % 250);
    if (fail.has_value() && rng() % 4 == 0) {
      a.device->InjectFailure(*fail, {.skip = static_cast<int>(rng() % 2), .code = absl::StatusCode::kInternal});
    }
    if (op.allocate) {
      absl::StatusOr<DeviceAddress> p = a->Allocate(op.size);
      a.device->ClearFailures();
      if (!p.ok() && fail.has_value()) p = a->Allocate(op.size);
      EXPECT_TRUE(p.ok()) << p.status();
      if (!p.ok()) return {};
      EXPECT_TRUE(a.device->FillHost(*p, op.size, pattern, kMinBlockSize).ok());
      live[op.id] = {*p, op.size};
    } else {
      const auto [address, size] = live.at(op.id);
      EXPECT_TRUE(*a.device->HostEquals(address, size, pattern, kMinBlockSize)) << "block " << op.id;
      const absl::Status freed = a->Free(address, size);
      a.device->ClearFailures();
      EXPECT_TRUE(freed.ok()) << freed;
      live.erase(op.id);
    }
    const absl::Status valid = a->Validate();
    EXPECT_TRUE(valid.ok()) << valid;
    if (!valid.ok()) return {};
  }
  std::vector<std::pair<DeviceAddress, uint64_t>> out;
  for (const auto& [id, block] : live) out.push_back(block);
  return out;
}

TEST(FollowingAPlan, RandomRunsFollowItOnTheDeviceItsPagesNeed) {
  int64_t moved = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const PlannedRun run = MakePlannedRun(seed, 4);
    auto a = Following(std::make_shared<const LayoutPlan>(run.plan), run.peak_page_bytes / (2 * kMiB));
    a->SetHistoryCapacity(1 << 16);
    const auto live = Replay(a, run, std::nullopt, seed);
    ASSERT_FALSE(::testing::Test::HasFailure());
    const MemoryStats stats = a->GetStats();
    EXPECT_EQ(a->PlanDeparture(), "");
    EXPECT_EQ(stats.num_planned_allocs, static_cast<int64_t>(run.plan.blocks.size() * 4 - 3 * run.plan.repeat_from));
    EXPECT_EQ(stats.num_ooms, 0);
    EXPECT_LE(stats.reserved_bytes[kAllPools].peak, static_cast<int64_t>(run.peak_page_bytes));
    moved += stats.num_pages_unmapped;
    EXPECT_EQ(testing::DrawableByMemoryViz(SnapshotToJson(a->TakeSnapshot()), /*history_from_start=*/true),
              absl::OkStatus());
    for (const auto& [address, size] : live) ASSERT_TRUE(a->Free(address).ok());
    ASSERT_TRUE(a->EmptyCache().ok());
    EXPECT_EQ(a.device->used_bytes(), 0u);
  }
  EXPECT_GT(moved, 0);  // on devices this tight, pages had to move
}

TEST(FollowingAPlan, BackendFailuresLeaveItConsistent) {
  for (BackendCall call : {BackendCall::kReserveAddressRange, BackendCall::kCreatePhysical, BackendCall::kMap,
                           BackendCall::kSetAccess, BackendCall::kUnmap, BackendCall::kSynchronizeStream}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(::testing::Message() << BackendCallName(call) << ", seed " << seed);
      const PlannedRun run = MakePlannedRun(seed, 3);
      // Tight enough that pages move, which unmaps and synchronizes.
      auto a = Following(std::make_shared<const LayoutPlan>(run.plan), run.peak_page_bytes / (2 * kMiB) + 1);
      const auto live = Replay(a, run, call, seed);
      ASSERT_FALSE(::testing::Test::HasFailure());
      for (const auto& [address, size] : live) ASSERT_TRUE(a->Free(address).ok());
      ASSERT_TRUE(a->EmptyCache().ok());
      HEADROOM_EXPECT_VALID(a);
      EXPECT_EQ(a->GetStats().reserved_bytes[kAllPools].current, 0);
      EXPECT_EQ(a.device->used_bytes(), 0u);
    }
  }
}

}  // namespace
}  // namespace headroom
