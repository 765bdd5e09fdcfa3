// The planned layout of a recorded trace: lifetimes counted in allocations,
// the replay's rules for a trace's anomalies, the page count against a
// brute-force one, and a recorded PyTorch run laid out without overlap.
#include "planner/trace_layout.h"

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

namespace headroom {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPage = 2 * kMiB;

TraceEvent Allocate(uint64_t pointer, uint64_t size) {
  return {.op = TraceOp::kAllocate, .pointer = pointer, .size = size};
}
TraceEvent Free(uint64_t pointer) { return {.op = TraceOp::kFree, .pointer = pointer}; }
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
  const absl::StatusOr<std::string> text = ReadTextFile(path);
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

}  // namespace
}  // namespace headroom
