// Issue [9]'s goals for Headroom's own policy (the `headroom` preset), on
// every recorded PyTorch run in bench/traces: whole training runs made by
// validation/record-trace (the model built, then six steps), on the CPU and
// on an H100. They are the
// goals, not figures fitted to the runs: less memory than both PyTorch
// policies, on an 80 GiB device and on the smallest device that runs the
// trace; within 1.05x the live peak; and after the first two steps no page
// mapped or unmapped. bench/RESULTS.md has the figures.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "allocator/alloc_conf.h"
#include "common/units.h"
#include "gtest/gtest.h"
#include "replay/allocation_trace.h"
#include "replay/recorded_run.h"
#include "replay/trace_replay.h"

namespace headroom {
namespace {

struct PolicyRun {
  ReplayResult result;
  uint64_t smallest = 0;
};

PolicyRun Replay(const AllocationTrace& trace, const std::vector<uint64_t>& step_ends, const std::string& preset) {
  ReplayOptions options{.capacity_bytes = 80 * kGiB,
                        .allocator = *ParseAllocConf(ResolveAllocConfPreset(preset)),
                        .step_end_times = step_ends};
  PolicyRun run;
  absl::StatusOr<ReplayResult> result = ReplayTrace(trace, options);
  EXPECT_TRUE(result.ok()) << result.status();
  if (result.ok()) run.result = *std::move(result);
  absl::StatusOr<uint64_t> smallest = SmallestDevice(trace, options);
  EXPECT_TRUE(smallest.ok()) << smallest.status();
  if (smallest.ok()) run.smallest = *smallest;
  return run;
}

// [9]'s goals that a run does not meet yet (bench/RESULTS.md has the figures). Each must still miss one, so the
// list cannot go stale; what every run must meet is checked for these too.
const std::set<std::string> kKnownMisses = {
    "lstm-fp32-adamw.cuda.6steps",     // 1.13x live, and pages move in every step
    "mixtral-fp32-adamw.cuda.6steps",  // reserves what expandable segments do, not less
};

TEST(RecordedRuns, HeadroomNeedsLessThanPyTorchAndSettles) {
  const absl::StatusOr<std::vector<std::string>> traces = RecordedRunTraces(HEADROOM_RECORDED_TRACES_DIR);
  ASSERT_TRUE(traces.ok()) << traces.status();
  std::set<std::string> unmatched = kKnownMisses;
  for (const std::string& path : *traces) {
    SCOPED_TRACE(path);
    const absl::StatusOr<RecordedRun> run = LoadRecordedRun(path);
    ASSERT_TRUE(run.ok()) << run.status();
    const AllocationTrace& trace = run->trace;
    const std::vector<uint64_t>& step_ends = run->step_end_times;
    ASSERT_GT(step_ends.size(), 2u);

    const PolicyRun pytorch = Replay(trace, step_ends, "pytorch-default");
    const PolicyRun expandable = Replay(trace, step_ends, "expandable");
    const PolicyRun headroom = Replay(trace, step_ends, "headroom");
    const std::vector<MemoryStats>& by_step = headroom.result.step_stats;
    ASSERT_EQ(by_step.size(), step_ends.size());
    // Every run: no anomaly or failure, less than PyTorch's default policy, no more than expandable segments.
    EXPECT_EQ(headroom.result.anomalies, 0u);
    EXPECT_EQ(headroom.result.ooms, 0);
    EXPECT_LT(headroom.result.peak_reserved_bytes, pytorch.result.peak_reserved_bytes);
    EXPECT_LE(headroom.result.peak_reserved_bytes, expandable.result.peak_reserved_bytes);
    EXPECT_LT(headroom.smallest, pytorch.smallest);
    EXPECT_LE(headroom.smallest, expandable.smallest);
    // The goals: within 1.05x the live peak, less than expandable segments, and a steady loop (the pages mapped
    // by the end of the second step are all the run maps, and none is unmapped).
    const std::vector<std::pair<std::string, bool>> goals = {
        {"reserved within 1.05x live", headroom.result.reserved_to_live <= 1.05},
        {"less reserved than expandable", headroom.result.peak_reserved_bytes < expandable.result.peak_reserved_bytes},
        {"a smaller device than expandable", headroom.smallest < expandable.smallest},
        {"smallest device within 1.05x live",
         static_cast<double>(headroom.smallest) <= 1.05 * static_cast<double>(headroom.result.peak_live_bytes)},
        {"no page mapped after step 2", by_step.back().num_pages_mapped == by_step[1].num_pages_mapped},
        {"no page unmapped after step 2", by_step.back().num_pages_unmapped == by_step[1].num_pages_unmapped},
    };
    const std::string name = std::filesystem::path(path).stem().stem().string();
    if (unmatched.erase(name) > 0) {
      EXPECT_TRUE(std::any_of(goals.begin(), goals.end(), [](const auto& goal) { return !goal.second; }))
          << name << " meets every goal now: take it off kKnownMisses";
    } else {
      for (const auto& [goal, met] : goals) EXPECT_TRUE(met) << goal;
    }
  }
  EXPECT_TRUE(unmatched.empty()) << "known misses with no trace: " << *unmatched.begin();
  EXPECT_GE(traces->size(), 8u);  // four runs on the CPU and four on a GPU; a missing directory must not pass
}

}  // namespace
}  // namespace headroom
