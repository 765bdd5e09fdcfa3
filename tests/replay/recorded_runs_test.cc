// Issue [9]'s goals for Headroom's own policy (the `headroom` preset), on
// every recorded PyTorch run in bench/traces: whole training runs made by
// validation/record-trace (the model built, then six steps), on the CPU and
// on an H100. They are the goals, not figures fitted to the runs: within
// 1.05x the live peak, also over a longer loop; the smallest device that
// runs the trace within 1.02x of it and smaller than both PyTorch policies
// need; and after the first two steps no page mapped or unmapped. The same
// goals for the policy following the plan of each run's repeating steps
// (Note [Following a layout plan]), and that a plan made from one recording
// holds in the next. Also the replay against PyTorch's own reserved bytes on
// the GPU runs.
// bench/RESULTS.md has the figures.
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "allocator/alloc_conf.h"
#include "common/units.h"
#include "gtest/gtest.h"
#include "layout/trace_layout.h"
#include "nlohmann/json.hpp"
#include "replay/allocation_trace.h"
#include "replay/recorded_run.h"
#include "replay/trace_replay.h"
#include "tests/allocator/memory_viz_model.h"

namespace headroom {
namespace {

struct PolicyRun {
  ReplayResult result;
  uint64_t smallest = 0;
};

PolicyRun Replay(const AllocationTrace& trace, const std::vector<uint64_t>& step_ends, AllocatorOptions allocator) {
  ReplayOptions options{.capacity_bytes = 80 * kGiB, .allocator = std::move(allocator), .step_end_times = step_ends};
  PolicyRun run;
  absl::StatusOr<ReplayResult> result = ReplayTrace(trace, options);
  EXPECT_TRUE(result.ok()) << result.status();
  if (result.ok()) run.result = *std::move(result);
  absl::StatusOr<uint64_t> smallest = SmallestDevice(trace, options);
  EXPECT_TRUE(smallest.ok()) << smallest.status();
  if (smallest.ok()) run.smallest = *smallest;
  return run;
}

PolicyRun Replay(const AllocationTrace& trace, const std::vector<uint64_t>& step_ends, const std::string& preset) {
  return Replay(trace, step_ends, *ParseAllocConf(ResolveAllocConfPreset(preset)));
}

// The headroom preset following the plan of the run's repeating steps, made from the run itself; nullopt where
// it has none (the LSTMs' repeating step leaves a block live, the CPU MoEs repeat no step).
std::optional<AllocatorOptions> FollowingItsPlan(const RecordedRun& run) {
  const absl::StatusOr<RepeatingStepsLayout> steps = LayoutRepeatingStepsEitherOrder(run.trace, run.step_end_times);
  if (!steps.ok()) return std::nullopt;
  AllocatorOptions options = *ParseAllocConf(ResolveAllocConfPreset("headroom"));
  options.layout_plan = std::make_shared<const LayoutPlan>(ToLayoutPlan(*steps));
  return options;
}

constexpr char kSmallestGoal[] = "smallest device within 1.02x live";
constexpr char kNoMoreThanExpandable[] = "no more reserved than expandable segments at 80 GiB";

// [9]'s goals that a run does not meet yet, by run (bench/RESULTS.md has the figures). A run must miss exactly
// the goals named here and meet the others, so the list cannot go stale.
const std::map<std::string, std::set<std::string>> kKnownMisses = {
    {"llama-mha-fp32-adamw-loop.6steps", {kSmallestGoal}},  // 1.021x live
    {"t5-fp32-adamw.6steps", {kSmallestGoal}},              // 1.026x live
};
// And following its plan, where a run has one (else the policy alone, as above).
const std::map<std::string, std::set<std::string>> kKnownMissesWithPlan = {
    // 1.039x live against 1.031x: the plan's range keeps the pages its steps touch, where the policy alone needs
    // 1.006x.
    {"gpt2-fp32-adamw.6steps", {kNoMoreThanExpandable}},
};

// "bench/traces/gpt2-fp32-adamw.6steps.rmm.csv" -> "gpt2-fp32-adamw.6steps".
std::string RunName(const std::string& path) { return std::filesystem::path(path).stem().stem().string(); }

TEST(RecordedRuns, HeadroomNeedsLessThanPyTorchAndSettles) {
  const absl::StatusOr<std::vector<std::string>> traces = RecordedRunTraces(HEADROOM_RECORDED_TRACES_DIR);
  ASSERT_TRUE(traces.ok()) << traces.status();
  std::set<std::string> unmatched, unmatched_with_plan;
  for (const auto& [name, missed] : kKnownMisses) unmatched.insert(name);
  for (const auto& [name, missed] : kKnownMissesWithPlan) unmatched_with_plan.insert(name);
  size_t planned = 0;
  for (const std::string& path : *traces) {
    SCOPED_TRACE(path);
    const absl::StatusOr<RecordedRun> run = LoadRecordedRun(path);
    ASSERT_TRUE(run.ok()) << run.status();
    const AllocationTrace& trace = run->trace;
    const std::vector<uint64_t>& step_ends = run->step_end_times;
    ASSERT_GT(step_ends.size(), 2u);

    const PolicyRun pytorch = Replay(trace, step_ends, "pytorch-default");
    const PolicyRun expandable = Replay(trace, step_ends, "expandable");
    const std::optional<AllocatorOptions> with_plan = FollowingItsPlan(*run);
    const std::string name = RunName(path);
    unmatched.erase(name);
    unmatched_with_plan.erase(name);
    for (const auto& [policy, known_misses] :
         {std::pair{"headroom", &kKnownMisses}, std::pair{"headroom following its plan", &kKnownMissesWithPlan}}) {
      SCOPED_TRACE(policy);
      const bool follows_plan = known_misses == &kKnownMissesWithPlan;
      if (follows_plan && !with_plan.has_value()) continue;  // the policy alone, checked above
      const PolicyRun headroom =
          follows_plan ? Replay(trace, step_ends, *with_plan) : Replay(trace, step_ends, "headroom");
      planned += follows_plan ? 1 : 0;
      const std::vector<MemoryStats>& by_step = headroom.result.step_stats;
      ASSERT_EQ(by_step.size(), step_ends.size());
      if (follows_plan) {  // the whole run, where the plan put it
        EXPECT_EQ(headroom.result.plan_departure, "");
        EXPECT_EQ(headroom.result.final_stats.num_planned_allocs, static_cast<int64_t>(headroom.result.allocations));
      }
      // Every run: no anomaly or failure, less than PyTorch's default policy.
      EXPECT_EQ(headroom.result.anomalies, 0u);
      EXPECT_EQ(headroom.result.ooms, 0);
      EXPECT_LT(headroom.result.peak_reserved_bytes, pytorch.result.peak_reserved_bytes);
      EXPECT_LT(headroom.smallest, pytorch.smallest);
      // Issue [9]'s goals: within 1.05x the live peak at 80 GiB, the smallest device within 1.02x of it and
      // smaller than expandable segments need, and a steady loop (the pages mapped by the end of the second step
      // are all the run maps, and none is unmapped); and ours, no more than expandable segments at 80 GiB.
      const auto live = static_cast<double>(headroom.result.peak_live_bytes);
      const std::vector<std::pair<std::string, bool>> goals = {
          {"reserved within 1.05x live", headroom.result.reserved_to_live <= 1.05},
          {kSmallestGoal, static_cast<double>(headroom.smallest) <= 1.02 * live},
          {"a smaller device than expandable", headroom.smallest < expandable.smallest},
          {"no page mapped after step 2", by_step.back().num_pages_mapped == by_step[1].num_pages_mapped},
          {"no page unmapped after step 2", by_step.back().num_pages_unmapped == by_step[1].num_pages_unmapped},
          {kNoMoreThanExpandable, headroom.result.peak_reserved_bytes <= expandable.result.peak_reserved_bytes},
      };
      const auto known = known_misses->find(name);
      for (const auto& [goal, met] : goals) {
        const bool known_miss = known != known_misses->end() && known->second.contains(goal);
        EXPECT_NE(met, known_miss) << goal << (known_miss ? ": met now, take it off the known misses" : "");
      }
    }
  }
  EXPECT_TRUE(unmatched_with_plan.empty()) << "known misses with no trace: " << *unmatched_with_plan.begin();
  EXPECT_EQ(planned, 9u);  // every run but the LSTMs and the CPU MoEs has a plan
  EXPECT_TRUE(unmatched.empty()) << "known misses with no trace: " << *unmatched.begin();
  EXPECT_GE(traces->size(), 13u);  // eight runs on the CPU and five on a GPU; a missing directory must not pass
}

// PyTorch's own figure, from each GPU run's snapshot: the segments it holds at the end. No run released memory
// (no empty_cache, no allocation retry), so their total is what PyTorch reserved at its peak.
uint64_t PyTorchsReservedBytes(const std::string& snapshot_path) {
  std::ifstream in(snapshot_path);
  const nlohmann::json snapshot = nlohmann::json::parse(in);
  uint64_t total = 0;
  for (const nlohmann::json& segment : snapshot.at("segments")) total += segment.at("total_size").get<uint64_t>();
  return total;
}

// The plan is made from one run and followed in the next: bench/traces/rerun holds a second recording of the
// Llama loop (validation/record-trace, 2026-11-27; the host's own pointers, so nothing but the job ties it to the
// first). The plan of the first recording's repeating steps places every allocation of the second, where the
// policy alone misses the 1.02x goal.
TEST(RecordedRuns, APlanFromOneRecordingHoldsInTheNext) {
  const std::string name = "llama-mha-fp32-adamw-loop.6steps.rmm.csv";
  const absl::StatusOr<RecordedRun> profile = LoadRecordedRun(std::string(HEADROOM_RECORDED_TRACES_DIR) + "/" + name);
  const absl::StatusOr<RecordedRun> next =
      LoadRecordedRun(std::string(HEADROOM_RECORDED_TRACES_DIR) + "/rerun/" + name);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_NE(profile->trace.events[0].pointer, next->trace.events[0].pointer);  // two recordings indeed
  const std::optional<AllocatorOptions> with_plan = FollowingItsPlan(*profile);
  ASSERT_TRUE(with_plan.has_value());
  const PolicyRun alone = Replay(next->trace, next->step_end_times, "headroom");
  const PolicyRun followed = Replay(next->trace, next->step_end_times, *with_plan);
  EXPECT_EQ(followed.result.plan_departure, "");
  EXPECT_EQ(followed.result.final_stats.num_planned_allocs, static_cast<int64_t>(followed.result.allocations));
  const auto live = static_cast<double>(followed.result.peak_live_bytes);
  EXPECT_GT(static_cast<double>(alone.smallest), 1.02 * live);
  EXPECT_LE(static_cast<double>(followed.smallest), 1.02 * live);
  EXPECT_LE(followed.result.reserved_to_live, 1.05);
}

// The replay against reality: each run recorded on the H100, replayed under the policy PyTorch ran it with,
// reserves at its peak exactly what PyTorch did: bench/traces' GPU runs under PyTorch's default policy,
// bench/traces/expandable's under expandable_segments:True (Note [Growable blocks]).
TEST(RecordedRuns, TheReplayReservesWhatPyTorchReservedOnTheGpu) {
  for (const auto& [directory, preset, at_least] :
       {std::tuple<std::string, std::string, size_t>{HEADROOM_RECORDED_TRACES_DIR, "pytorch-default", 5},
        {std::string(HEADROOM_RECORDED_TRACES_DIR) + "/expandable", "expandable", 3}}) {
    const absl::StatusOr<std::vector<std::string>> traces = RecordedRunTraces(directory);
    ASSERT_TRUE(traces.ok()) << traces.status();
    size_t checked = 0;
    for (const std::string& path : *traces) {
      if (!path.ends_with(".snapshot.json")) continue;
      SCOPED_TRACE(path);
      const absl::StatusOr<RecordedRun> run = LoadRecordedRun(path);
      ASSERT_TRUE(run.ok()) << run.status();
      const absl::StatusOr<ReplayResult> result = ReplayTrace(
          run->trace, {.capacity_bytes = 80 * kGiB, .allocator = *ParseAllocConf(ResolveAllocConfPreset(preset))});
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->peak_reserved_bytes, PyTorchsReservedBytes(path)) << preset;
      ++checked;
    }
    EXPECT_GE(checked, at_least) << directory;
  }
}

// A training loop runs far longer than six steps. With steps 3 to 6 played ten times over (42 steps), every run
// stays within 1.05x its live peak and maps and unmaps nothing after the second step, with its plan too.
TEST(RecordedRuns, HeadroomKeepsItsBoundOverALongerLoop) {
  const absl::StatusOr<std::vector<std::string>> traces = RecordedRunTraces(HEADROOM_RECORDED_TRACES_DIR);
  ASSERT_TRUE(traces.ok()) << traces.status();
  for (const std::string& path : *traces) {
    SCOPED_TRACE(path);
    const absl::StatusOr<RecordedRun> run = LoadRecordedRun(path);
    ASSERT_TRUE(run.ok()) << run.status();
    const absl::StatusOr<RecordedRun> longer = RepeatSteps(*run, 2, 10);
    ASSERT_TRUE(longer.ok()) << longer.status();
    ASSERT_EQ(longer->step_end_times.size(), 42u);
    std::vector<AllocatorOptions> policies = {*ParseAllocConf(ResolveAllocConfPreset("headroom"))};
    if (std::optional<AllocatorOptions> with_plan = FollowingItsPlan(*run)) policies.push_back(*with_plan);
    for (const AllocatorOptions& policy : policies) {
      SCOPED_TRACE(policy.layout_plan != nullptr ? "following its plan" : "the policy alone");
      const absl::StatusOr<ReplayResult> result = ReplayTrace(
          longer->trace, {.capacity_bytes = 80 * kGiB, .allocator = policy, .step_end_times = longer->step_end_times});
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->anomalies, 0u);
      EXPECT_EQ(result->ooms, 0);
      EXPECT_EQ(result->plan_departure, "");
      EXPECT_LE(result->reserved_to_live, 1.05);
      const std::vector<MemoryStats>& by_step = result->step_stats;
      ASSERT_EQ(by_step.size(), 42u);
      EXPECT_EQ(by_step.back().num_pages_mapped, by_step[1].num_pages_mapped);
      EXPECT_EQ(by_step.back().num_pages_unmapped, by_step[1].num_pages_unmapped);
    }
  }
}

// RepeatSteps on a run small enough to check by hand: a weight and a scratch block allocated while the model is
// built, then two steps. Each allocates an activation and frees it; the first also frees the scratch block, the
// second the first step's gradient.
// The model of memory_viz the allocator's snapshots are checked against
// (tests/allocator/memory_viz_model.h) is itself checked against PyTorch:
// it accepts every snapshot PyTorch wrote on the H100, the whole runs of
// bench/traces (recorded from the start, so nothing may remain before their
// first event) and the fixtures' one-step histories.
TEST(MemoryVizModel, AcceptsEverySnapshotPyTorchWrote) {
  int checked = 0;
  for (const auto& [dir, from_start] : {std::pair{std::string(HEADROOM_RECORDED_TRACES_DIR), true},
                                        std::pair{std::string(HEADROOM_RECORDED_TRACES_DIR) + "/expandable", true},
                                        std::pair{std::string(HEADROOM_CUDA_FIXTURE_TRACES_DIR), false}}) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (!entry.path().string().ends_with(".snapshot.json")) continue;
      SCOPED_TRACE(entry.path().string());
      std::ifstream in(entry.path());
      const nlohmann::json snapshot = nlohmann::json::parse(in);
      EXPECT_EQ(testing::DrawableByMemoryViz(snapshot, from_start), absl::OkStatus());
      ++checked;
    }
  }
  EXPECT_EQ(checked, 5 + 3 + 33);
}

TEST(RepeatSteps, PlaysTheStepsOverWithNewBlocks) {
  RecordedRun run;
  run.trace.source = "tiny";
  using enum TraceOp;
  run.trace.events = {{kAllocate, 1, 100, 0, 1}, {kAllocate, 5, 1, 0, 1}, {kAllocate, 2, 10, 0, 2},
                      {kAllocate, 3, 20, 0, 3},  {kFree, 2, 10, 0, 4},    {kFree, 5, 1, 0, 4},
                      {kAllocate, 4, 10, 0, 5},  {kFree, 3, 20, 0, 6},    {kFree, 4, 10, 0, 7},
                      {kFree, 1, 100, 0, 8}};
  run.step_end_times = {1, 4, 7};  // the model built; step 1: times 2-4; step 2: times 5-7
  const absl::StatusOr<RecordedRun> longer = RepeatSteps(run, 1, 3);
  ASSERT_TRUE(longer.ok()) << longer.status();
  EXPECT_EQ(longer->step_end_times, (std::vector<uint64_t>{1, 4, 7, 10, 13, 16, 19}));
  // Each repeat frees its own blocks; the scratch block is freed once. Nothing is freed twice or left live.
  std::set<uint64_t> live;
  uint64_t frees = 0;
  for (const TraceEvent& e : longer->trace.events) {
    if (e.op == kAllocate) {
      EXPECT_TRUE(live.insert(e.pointer).second) << e.time_ns;
    } else {
      EXPECT_EQ(live.erase(e.pointer), 1u) << e.time_ns;
      ++frees;
    }
  }
  EXPECT_TRUE(live.empty());
  EXPECT_EQ(frees, 4u + 2 * 3 + 1);
  EXPECT_EQ(longer->trace.events.size(), 2u + 7 + 2 * 6 + 1);
  EXPECT_EQ(longer->trace.events.back().time_ns, 8u + 2 * 6);
  for (const auto& [first, times] : std::vector<std::pair<size_t, int>>{{0, 1}, {3, 1}, {1, 0}}) {
    EXPECT_EQ(RepeatSteps(run, first, times).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // Times that would wrap past 2^64 ns.
  RecordedRun long_steps = run;
  long_steps.step_end_times = {1, 4, std::numeric_limits<uint64_t>::max() / 2};
  const absl::StatusOr<RecordedRun> wrapped = RepeatSteps(long_steps, 1, 3);
  EXPECT_EQ(wrapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrapped.status().message().find("tiny: repeating steps 2 to 3 3 times"), std::string_view::npos)
      << wrapped.status();
  EXPECT_TRUE(RepeatSteps(long_steps, 1, 2).ok());
}

}  // namespace
}  // namespace headroom
