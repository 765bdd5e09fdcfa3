// A plan's allocation trace: its exact order on a hand-built schedule with
// copies, and on a model's checkpointed step, parsed back by the RMM parser
// and replayed through the simulated caching allocator, whose peak must be
// ProfileMemory's.
#include "replay/graph_trace.h"

#include <algorithm>
#include <string>
#include <vector>

#include "allocator/size_rounding.h"
#include "gmock/gmock.h"
#include "graph/liveness.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/checkpoint_mode_plan.h"
#include "replay/allocation_trace.h"
#include "replay/trace_replay.h"
#include "tests/planner/step_fixtures.h"

namespace headroom {
namespace {

using ::headroom::testing::Gpt2Step;
using ::headroom::testing::OffloadGraph;

using ::testing::HasSubstr;

TEST(PlanTrace, OrderOnAScheduleWithCopies) {
  const Graph g = OffloadGraph();
  ASSERT_TRUE(g.Validate().ok()) << g.Validate();
  absl::StatusOr<AllocationTrace> trace = PlanAllocationTrace(g);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->source, "offload");
  // x lives all step; a until its offload (op 2); b until fc3; the prefetched
  // copy from op 4. Op 3 allocates c before it frees b; op 5 frees in
  // TensorId order.
  EXPECT_EQ(FormatRmmLog(*trace),
            "Thread,Time,Action,Pointer,Size,Stream\n"
            "1,0.000000000,allocate,0x7f0000000000,1024,0x0\n"
            "1,0.000000000,allocate,0x7f0000000400,4096,0x0\n"
            "1,0.000000001,allocate,0x7f0000001400,8192,0x0\n"
            "1,0.000000002,free,0x7f0000000400,4096,0x0\n"
            "1,0.000000003,allocate,0x7f0000003400,2048,0x0\n"
            "1,0.000000003,free,0x7f0000001400,8192,0x0\n"
            "1,0.000000004,allocate,0x7f0000003c00,4096,0x0\n"
            "1,0.000000005,allocate,0x7f0000004c00,1024,0x0\n"
            "1,0.000000005,free,0x7f0000000000,1024,0x0\n"
            "1,0.000000005,free,0x7f0000003400,2048,0x0\n"
            "1,0.000000005,free,0x7f0000003c00,4096,0x0\n"
            "1,0.000000005,free,0x7f0000004c00,1024,0x0\n");
  absl::StatusOr<ReplayResult> replay = ReplayTrace(*trace, {.strict = true});
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->peak_live_bytes, ProfileMemory(g).peak_bytes);
  EXPECT_EQ(replay->peak_live_bytes, 13312u);  // x, a and b during fc2 and the offload
}

// The most bytes live at one op after the allocator rounds every request.
uint64_t RoundedPeak(const Graph& step, const ProfileOptions& options) {
  const std::vector<TensorLifetime> life = ComputeLifetimes(step, options);
  std::vector<uint64_t> live(step.num_ops() + 1, 0);
  for (const Tensor& t : step.tensors()) {
    const TensorLifetime& l = life[static_cast<size_t>(t.id)];
    if (l.first > l.last || t.bytes() == 0) continue;
    for (OpId op = l.first; op <= l.last; ++op) live[static_cast<size_t>(op)] += RoundSize(t.bytes(), {});
  }
  return *std::max_element(live.begin(), live.end());
}

TEST(PlanTrace, ReplayedStepPeaksWhereProfileMemoryDoes) {
  for (CheckpointMode mode : {CheckpointMode::kOff, CheckpointMode::kFull, CheckpointMode::kSelective}) {
    for (bool parameter_gradients : {true, false}) {
      SCOPED_TRACE(std::string(CheckpointModeName(mode)) + (parameter_gradients ? "" : ", no parameter gradients"));
      const Graph step = Gpt2Step(mode);
      const ProfileOptions options{.count_parameter_gradients = parameter_gradients};
      absl::StatusOr<AllocationTrace> trace = PlanAllocationTrace(step, options);
      ASSERT_TRUE(trace.ok()) << trace.status();
      // Through the CSV, as `headroom replay` would read it.
      absl::StatusOr<AllocationTrace> parsed = ParseRmmLog(FormatRmmLog(*trace), "plan.rmm.csv");
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      ASSERT_EQ(parsed->events.size(), trace->events.size());
      absl::StatusOr<ReplayResult> replay = ReplayTrace(*parsed, {.strict = true});
      ASSERT_TRUE(replay.ok()) << replay.status();
      const MemoryProfile profile = ProfileMemory(step, options);
      EXPECT_EQ(replay->peak_live_bytes, profile.peak_bytes);
      // Allocated bytes are whole blocks: each request rounded up, and a
      // large-pool block is not split when less than 1 MiB would remain.
      EXPECT_GE(replay->peak_allocated_bytes, RoundedPeak(step, options));
      EXPECT_GE(RoundedPeak(step, options), profile.peak_bytes);
      EXPECT_EQ(replay->anomalies, 0u);
      EXPECT_EQ(replay->allocations, replay->frees);
      EXPECT_EQ(replay->final_stats.allocated_bytes[kAllPools].current, 0);
      // Every event at the op its time names, and in op order.
      EXPECT_TRUE(std::is_sorted(parsed->events.begin(), parsed->events.end(),
                                 [](const TraceEvent& a, const TraceEvent& b) { return a.time_ns < b.time_ns; }));
      EXPECT_EQ(parsed->events.back().time_ns, step.num_ops() - 1);
    }
  }
}

TEST(PlanTrace, ZeroByteTensorsGetTheNullPointer) {
  Graph g("empty");
  const TensorId x = g.AddTensor({.name = "x", .shape = {0}, .role = TensorRole::kInput});
  const TensorId y = g.AddTensor({.name = "y", .shape = {4}});
  g.AddOp({.kind = "pad", .name = "pad", .inputs = {x}, .outputs = {y}});
  absl::StatusOr<AllocationTrace> trace = PlanAllocationTrace(g);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(FormatRmmLog(*trace),
            "Thread,Time,Action,Pointer,Size,Stream\n"
            "1,0.000000000,allocate,0x0,0,0x0\n"
            "1,0.000000000,allocate,0x7f0000000000,16,0x0\n"
            "1,0.000000000,free,0x0,0,0x0\n"
            "1,0.000000000,free,0x7f0000000000,16,0x0\n");
  EXPECT_EQ(ReplayTrace(*trace, {.strict = true})->peak_live_bytes, 16u);
  EXPECT_EQ(FormatRmmLog(*PlanAllocationTrace(Graph("none"))), "Thread,Time,Action,Pointer,Size,Stream\n");
}

TEST(PlanTrace, RmmLogRoundTrips) {
  const AllocationTrace trace{
      .source = "t",
      .format = "rmm-csv",
      .events = {{.op = TraceOp::kAllocate, .pointer = 0x7f00deadbe00, .size = 123, .time_ns = 1634567890234567891},
                 {.op = TraceOp::kAllocateFailure, .size = uint64_t{1} << 40, .stream = 0x5a, .time_ns = 7},
                 {.op = TraceOp::kFree, .pointer = 0x7f00deadbe00, .size = 123, .stream = 0x5a,
                  .time_ns = 1'000'000'000}}};
  const std::string csv = FormatRmmLog(trace);
  EXPECT_THAT(csv, HasSubstr("1,1634567890.234567891,allocate,0x7f00deadbe00,123,0x0\n"));
  EXPECT_THAT(csv, HasSubstr("1,0.000000007,allocate failure,0x0,1099511627776,0x5a\n"));
  absl::StatusOr<AllocationTrace> parsed = ParseRmmLog(csv, "t");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->events.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const TraceEvent& a = trace.events[i];
    const TraceEvent& b = parsed->events[i];
    EXPECT_EQ(a.op, b.op) << i;
    EXPECT_EQ(a.pointer, b.pointer) << i;
    EXPECT_EQ(a.size, b.size) << i;
    EXPECT_EQ(a.stream, b.stream) << i;
    EXPECT_EQ(a.time_ns, b.time_ns) << i;
    EXPECT_EQ(b.line, i + 2) << i;
  }
}

TEST(PlanTrace, ErrorsNameTheTensor) {
  Graph g("huge");
  const TensorId x = g.AddTensor({.name = "huge_input", .shape = {1 << 20, 1 << 20}, .role = TensorRole::kInput});
  const TensorId y = g.AddTensor({.name = "y", .shape = {4}});
  g.AddOp({.kind = "sum", .name = "s", .inputs = {x}, .outputs = {y}});
  absl::Status status = PlanAllocationTrace(g).status();
  EXPECT_TRUE(absl::IsOutOfRange(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("huge_input"));
}

}  // namespace
}  // namespace headroom
