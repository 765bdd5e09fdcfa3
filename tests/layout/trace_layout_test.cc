// The planned layout of a recorded trace: lifetimes counted in allocations,
// the replay's rules for a trace's anomalies, the page count against a
// brute-force one, and a recorded PyTorch run laid out without overlap; the
// plan of its repeating steps, followed through every recorded step.
#include "layout/trace_layout.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/json_fields.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay/allocation_trace.h"
#include "replay/recorded_run.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPage = 2 * kMiB;

TraceEvent Allocate(uint64_t pointer, uint64_t size) {
  return {.op = TraceOp::kAllocate, .pointer = pointer, .size = size};
}
TraceEvent Free(uint64_t pointer) { return {.op = TraceOp::kFree, .pointer = pointer}; }
// Events timed 1, 2, 3, ... and numbered as lines 2, 3, ... of a CSV.
std::vector<TraceEvent> Timed(std::vector<TraceEvent> events) {
  for (size_t i = 0; i < events.size(); ++i) {
    events[i].time_ns = i + 1;
    events[i].line = i + 2;
  }
  return events;
}
AllocationTrace Trace(std::vector<TraceEvent> events) {
  return {.source = "test.csv", .format = "rmm-csv", .events = std::move(events)};
}

TEST(TraceLayout, ABlockFreedBeforeTheNextAllocationLendsItsAddress) {
  const absl::StatusOr<TraceLayout> layout =
      LayoutTrace(Trace({Allocate(1, 3 * kMiB), Free(1), Allocate(2, 3 * kMiB), Free(2)}));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->arena.blocks[0].offset, layout->arena.blocks[1].offset);
  EXPECT_EQ(layout->arena.arena_bytes, 3 * kMiB);
  EXPECT_EQ(layout->peak_page_bytes, 2 * kPage);
}

TEST(TraceLayout, ABlockFreedAfterTheNextAllocationDoesNot) {
  const absl::StatusOr<TraceLayout> layout =
      LayoutTrace(Trace({Allocate(1, 3 * kMiB), Allocate(2, 3 * kMiB), Free(1), Free(2)}));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_NE(layout->arena.blocks[0].offset, layout->arena.blocks[1].offset);
  EXPECT_EQ(layout->arena.arena_bytes, 6 * kMiB);
  EXPECT_EQ(layout->peak_page_bytes, 3 * kPage);  // 6 MiB packed from offset 0
}

TEST(TraceLayout, PagesCountEveryPageABlockTouches) {
  // 1.5 MiB and 1 MiB live together: 2.5 MiB laid out from 0 touch two pages.
  const absl::StatusOr<TraceLayout> layout =
      LayoutTrace(Trace({Allocate(1, 3 * kMiB / 2), Allocate(2, kMiB), Free(2), Free(1)}));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->arena.lower_bound_bytes, 5 * kMiB / 2);
  EXPECT_EQ(layout->peak_page_bytes, 2 * kPage);
}

TEST(TraceLayout, FollowsTheReplaysRulesForATracesAnomalies) {
  const absl::StatusOr<TraceLayout> layout = LayoutTrace(Trace({
      Free(9),  // never allocated: skipped
      {.op = TraceOp::kAllocateFailure, .pointer = 3, .size = 64 * kMiB},  // failed: skipped
      Allocate(0, 0),  // null: skipped
      Allocate(1, 4 * kMiB),
      Allocate(1, 4 * kMiB),  // live again: the first one's free is missing, so it ends here
      Allocate(2, 0),  // 0 bytes at a real pointer: a block that takes no space
  }));
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->arena.blocks.size(), 3u);
  EXPECT_EQ(layout->arena.blocks[0].last, 0);
  EXPECT_EQ(layout->arena.blocks[1].last, 2);  // never freed: to the end
  EXPECT_EQ(layout->arena.lower_bound_bytes, 4 * kMiB);
  EXPECT_EQ(layout->peak_page_bytes, 2 * kPage);
}

TEST(TraceLayout, RejectsABadPageSizeAndNamesTheTraceOfAnImpossibleBlock) {
  const AllocationTrace trace = Trace({Allocate(1, kMiB)});
  EXPECT_THAT(LayoutTrace(trace, 0).status().message(), HasSubstr("page size 0 bytes"));
  EXPECT_THAT(LayoutTrace(trace, 1000).status().message(), HasSubstr("multiple of 512"));
  const absl::StatusOr<TraceLayout> huge = LayoutTrace(Trace({Allocate(1, kMaxTensorBytes + 1)}));
  EXPECT_TRUE(absl::IsOutOfRange(huge.status())) << huge.status();
  EXPECT_THAT(huge.status().message(), HasSubstr("test.csv: "));
}

// The pages live blocks touch, counted block by block, page by page (0-byte blocks touch none).
uint64_t BruteForcePeakPages(const AllocationTrace& trace, const TraceLayout& layout) {
  std::vector<int> live_blocks;
  std::vector<int> block_of_pointer(64, -1);
  uint64_t peak = 0;
  int next = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.op == TraceOp::kFree) {
      std::erase(live_blocks, block_of_pointer[e.pointer]);
      block_of_pointer[e.pointer] = -1;
    } else {
      block_of_pointer[e.pointer] = next;
      live_blocks.push_back(next++);
    }
    std::set<uint64_t> pages;
    for (int b : live_blocks) {
      const ArenaBlock& block = layout.arena.blocks[b];
      for (uint64_t page = block.offset / kPage; page * kPage < block.offset + block.size; ++page) pages.insert(page);
    }
    peak = std::max<uint64_t>(peak, pages.size() * kPage);
  }
  return peak;
}

TEST(TraceLayout, CountsPagesAsABruteForceCountDoes) {
  std::mt19937 rng(7);
  for (int round = 0; round < 40; ++round) {
    std::vector<TraceEvent> events;
    std::vector<uint64_t> live;
    for (uint64_t pointer = 1; pointer < 64; ++pointer) {
      while (!live.empty() && rng() % 3 == 0) {
        const size_t k = rng() % live.size();
        events.push_back(Free(live[k]));
        live.erase(live.begin() + static_cast<ptrdiff_t>(k));
      }
      events.push_back(Allocate(pointer, (1 + rng() % 2048) * 4096));  // 4 KiB to 8 MiB
      live.push_back(pointer);
    }
    const AllocationTrace trace = Trace(events);
    const absl::StatusOr<TraceLayout> layout = LayoutTrace(trace);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->peak_page_bytes, BruteForcePeakPages(trace, *layout)) << "round " << round;
  }
}

TEST(TraceLayout, LaysOutARecordedRunWithoutOverlapAtItsLivePeak) {
  const std::string path = std::string(HEADROOM_RECORDED_TRACES_DIR) + "/llama-mha-fp32-adamw-loop.6steps.rmm.csv";
  const absl::StatusOr<std::string> text = ReadTextFile(path, kTraceFile);
  ASSERT_TRUE(text.ok()) << text.status();
  const absl::StatusOr<AllocationTrace> trace = ParseAllocationTrace(*text, path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const absl::StatusOr<TraceLayout> layout = LayoutTrace(*trace);
  ASSERT_TRUE(layout.ok()) << layout.status();

  // The live peak from the lifetimes is the trace's own, counted event by event in 512-byte blocks.
  absl::flat_hash_map<uint64_t, uint64_t> live;
  uint64_t live_bytes = 0;
  uint64_t peak = 0;
  for (const TraceEvent& e : trace->events) {
    if (e.op == TraceOp::kAllocate) {
      live[e.pointer] = (e.size + 511) / 512 * 512;
      live_bytes += live[e.pointer];
    } else if (auto it = live.find(e.pointer); it != live.end()) {
      live_bytes -= it->second;
      live.erase(it);
    }
    peak = std::max(peak, live_bytes);
  }
  EXPECT_EQ(layout->arena.lower_bound_bytes, peak);

  // No two blocks live at one moment share a byte.
  const std::vector<ArenaBlock>& blocks = layout->arena.blocks;
  size_t overlaps = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t j = i + 1; j < blocks.size() && blocks[j].first <= blocks[i].last; ++j) {
      overlaps += blocks[i].offset < blocks[j].offset + blocks[j].size &&
                  blocks[j].offset < blocks[i].offset + blocks[i].size;
    }
  }
  EXPECT_EQ(overlaps, 0u);
  const uint64_t live_pages = (layout->arena.lower_bound_bytes + kPage - 1) / kPage * kPage;
  EXPECT_GE(layout->peak_page_bytes, live_pages);
  EXPECT_LE(layout->peak_page_bytes, (layout->arena.arena_bytes + kPage - 1) / kPage * kPage);
}

// Follows the plan through every allocation of the recorded steps (after
// the last step's end, the trace is the program's teardown, not a step) and
// counts the pairs of blocks live at once that share a byte.
size_t OverlapsFollowingThePlan(const AllocationTrace& trace, uint64_t last_step_end_time,
                                const RepeatingStepsLayout& plan) {
  const std::vector<ArenaBlock>& blocks = plan.layout.arena.blocks;
  const size_t first = plan.first_step_allocation;
  const size_t period = blocks.size() - first;
  struct Live {
    uint64_t offset, size;
  };
  absl::flat_hash_map<uint64_t, Live> live;
  size_t allocations = 0;
  size_t overlaps = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.time_ns > last_step_end_time) break;
    if (e.op == TraceOp::kFree) {
      live.erase(e.pointer);
      continue;
    }
    if (e.op != TraceOp::kAllocate) continue;
    const size_t n = allocations++;
    const ArenaBlock& planned = blocks[n < first ? n : first + (n - first) % period];
    EXPECT_EQ(planned.size, (e.size + 511) / 512 * 512) << "allocation " << n;
    for (const auto& [pointer, other] : live) {
      overlaps += planned.offset < other.offset + other.size && other.offset < planned.offset + planned.size;
    }
    live[e.pointer] = {planned.offset, planned.size};
  }
  return overlaps;
}

TEST(RepeatingSteps, LaysOutTheStepsUpToTheOneEveryLaterStepRepeats) {
  // The build keeps a weight; step 1 also creates optimizer state; steps 2 to 4 do the same.
  const AllocationTrace trace = Trace(Timed({
      Allocate(1, 4 * kMiB),                                               // build: the weight
      Allocate(2, 8 * kMiB), Allocate(3, 4 * kMiB), Free(2),              // step 1, and its state (3)
      Allocate(4, 8 * kMiB), Allocate(5, 2 * kMiB), Free(5), Free(4),     // step 2
      Allocate(6, 8 * kMiB), Allocate(7, 2 * kMiB), Free(7), Free(6),     // step 3
      Allocate(8, 8 * kMiB), Allocate(9, 2 * kMiB), Free(9), Free(8),     // step 4
  }));
  const std::vector<uint64_t> step_ends = {4, 8, 12, 16};
  const absl::StatusOr<RepeatingStepsLayout> plan = LayoutRepeatingSteps(trace, step_ends);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->repeating_step, 2u);
  EXPECT_EQ(plan->first_step_allocation, 3u);
  EXPECT_EQ(plan->layout.arena.blocks.size(), 5u);  // the build and steps 1 and 2
  EXPECT_EQ(plan->layout.arena.lower_bound_bytes, 18 * kMiB);
  EXPECT_EQ(OverlapsFollowingThePlan(trace, step_ends.back(), *plan), 0u);
}

// The allocator's plan of it (allocator/layout_plan.h): the blocks in trace order, repeating from the step's
// first, with a 0-byte allocation (which no allocator counts) left out and the repeat moved with it.
TEST(RepeatingSteps, MakeThePlanTheAllocatorFollows) {
  const AllocationTrace trace = Trace(Timed({
      Allocate(1, 4 * kMiB), Allocate(10, 0),                              // build: the weight, and an empty block
      Allocate(2, 8 * kMiB), Allocate(3, 4 * kMiB), Free(2),              // step 1, and its state (3)
      Allocate(4, 8 * kMiB), Allocate(5, 2 * kMiB - 100), Free(5), Free(4),  // step 2
      Allocate(6, 8 * kMiB), Allocate(7, 2 * kMiB - 100), Free(7), Free(6),  // step 3
  }));
  const std::vector<uint64_t> step_ends = {5, 9, 13};
  const absl::StatusOr<RepeatingStepsLayout> steps = LayoutRepeatingStepsEitherOrder(trace, step_ends);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->first_step_allocation, 4u);
  const LayoutPlan plan = ToLayoutPlan(*steps);
  EXPECT_EQ(CheckLayoutPlan(plan, "plan"), absl::OkStatus());
  ASSERT_EQ(plan.blocks.size(), 5u);
  EXPECT_EQ(plan.repeat_from, 3u);
  EXPECT_EQ(plan.blocks[4].size, 2 * kMiB);  // 2 MiB - 100 bytes, rounded to 512
  const std::vector<ArenaBlock>& laid = steps->layout.arena.blocks;
  EXPECT_EQ(plan.blocks[2].offset, laid[3].offset);
  EXPECT_EQ(plan.At(5), &plan.blocks[3]);  // step 3's first block: step 2's
  // Either order: the one whose pages peak lower.
  for (ArenaOrder order : {ArenaOrder::kSize, ArenaOrder::kSizeTimesLifetime}) {
    const absl::StatusOr<RepeatingStepsLayout> one = LayoutRepeatingSteps(trace, step_ends, kPage, order);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_LE(steps->layout.peak_page_bytes, one->layout.peak_page_bytes);
  }
}

TEST(RepeatingSteps, NeedsALaterStepToRepeatOne) {
  const AllocationTrace trace = Trace(Timed({Allocate(1, kMiB), Free(1), Allocate(2, kMiB), Free(2),
                                             Allocate(3, 2 * kMiB), Free(3)}));
  const absl::StatusOr<RepeatingStepsLayout> differ = LayoutRepeatingSteps(trace, std::vector<uint64_t>{2, 4, 6});
  EXPECT_TRUE(absl::IsNotFound(differ.status())) << differ.status();
  EXPECT_THAT(differ.status().message(), HasSubstr("no step of the 3 recorded is repeated by every later one"));
  EXPECT_TRUE(absl::IsNotFound(LayoutRepeatingSteps(trace, std::vector<uint64_t>{6}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(LayoutRepeatingSteps(trace, std::vector<uint64_t>{4, 2}).status()));
}

TEST(RepeatingSteps, RefusesAStepThatLeavesItsBlocksLive) {
  // Each step frees the block the step before left (as gradients freed at the next step's start).
  const AllocationTrace trace = Trace(Timed({Allocate(1, kMiB),                        // step 1
                                             Free(1), Allocate(2, kMiB),               // step 2
                                             Free(2), Allocate(3, kMiB),               // step 3
                                             Free(3), Allocate(4, kMiB)}));            // step 4
  const absl::StatusOr<RepeatingStepsLayout> plan = LayoutRepeatingSteps(trace, std::vector<uint64_t>{1, 3, 5, 7});
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("step 2, which every later step repeats, leaves 1 of its blocks live "
                                                 "at its end (the first allocated at test.csv:4)"));
}

// The recorded runs' plans hold through all their steps: every step from the second repeats the second.
TEST(RepeatingSteps, ARecordedRunsPlanHoldsInEveryLaterStep) {
  for (const char* name : {"llama-mha-fp32-adamw-loop.6steps.rmm.csv", "t5-fp32-adamw.6steps.rmm.csv"}) {
    const absl::StatusOr<RecordedRun> run = LoadRecordedRun(std::string(HEADROOM_RECORDED_TRACES_DIR) + "/" + name);
    ASSERT_TRUE(run.ok()) << run.status();
    for (ArenaOrder order : {ArenaOrder::kSize, ArenaOrder::kSizeTimesLifetime}) {
      const absl::StatusOr<RepeatingStepsLayout> plan =
          LayoutRepeatingSteps(run->trace, run->step_end_times, kPage, order);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->repeating_step, 2u) << name;
      EXPECT_EQ(OverlapsFollowingThePlan(run->trace, run->step_end_times.back(), *plan), 0u) << name;
    }
  }
}

}  // namespace
}  // namespace headroom
