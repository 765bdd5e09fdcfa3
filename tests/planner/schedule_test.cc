// Schedules as plans: materialization agrees with the step builder's own
// checkpointing, the independent validator agrees with ProfileMemory, and
// bad schedules are refused naming the entry.
#include "planner/schedule.h"

#include <random>
#include <string>
#include <vector>

#include "common/quote.h"
#include "gmock/gmock.h"
#include "graph/liveness.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/checkpoint_mode_plan.h"
#include "planner/plan.h"
#include "planner/planner.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

Graph Gpt2Forward(AttentionImpl attention = AttentionImpl::kEager) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("gpt2");
  EXPECT_TRUE(config.ok()) << config.status();
  config->num_layers = 4;
  absl::StatusOr<Graph> forward =
      BuildModelGraph(*config, {.batch = 2, .seq_len = 128, .param_dtype = DType::kBF16,
                                .compute_dtype = DType::kBF16, .attention = attention});
  EXPECT_TRUE(forward.ok()) << forward.status();
  return *std::move(forward);
}

// The step's plan: the forward plan, nothing checkpointed after it.
CheckpointPlan OnStep(const Graph& step, CheckpointPlan forward_plan) {
  if (!forward_plan.segment_of_op.empty()) forward_plan.segment_of_op.resize(step.num_ops(), kNone);
  return forward_plan;
}

PlanProblem ProblemFor(const Graph& step, uint64_t budget = uint64_t{1} << 50) {
  return {.step = &step, .op_cost = std::vector<double>(step.num_ops(), 1.0), .budget = budget};
}

TEST(Schedule, StoreAllIsTheStepItself) {
  const Graph step = *BuildTrainingStep(Gpt2Forward(), {});
  const Schedule s = StoreAllSchedule(step);
  absl::StatusOr<Graph> out = MaterializeSchedule(step, s);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->Validate().ok());
  EXPECT_EQ(ProfileMemory(*out).peak_bytes, ProfileMemory(step).peak_bytes);
  EXPECT_EQ(ProfileMemory(*out).live_bytes, ProfileMemory(step).live_bytes);
}

// A segment schedule over the unchekpointed step is what BuildTrainingStep
// makes of the same plan: the same peak, the same replayed ops.
TEST(Schedule, SegmentsMatchTheStepBuilder) {
  for (AttentionImpl attention : {AttentionImpl::kEager, AttentionImpl::kFlash}) {
    const Graph forward = Gpt2Forward(attention);
    const Graph step = *BuildTrainingStep(forward, {});
    for (CheckpointMode mode : {CheckpointMode::kFull, CheckpointMode::kEveryK, CheckpointMode::kSqrtN,
                                CheckpointMode::kSelective}) {
      SCOPED_TRACE(std::string(CheckpointModeName(mode)));
      const CheckpointPlan plan = *PlanForMode(forward, mode, /*every=*/2);
      const Graph built = *BuildTrainingStep(forward, {.checkpoint = plan});
      absl::StatusOr<Schedule> s = SegmentSchedule(step, OnStep(step, plan));
      ASSERT_TRUE(s.ok()) << s.status();
      absl::StatusOr<Graph> out = MaterializeSchedule(step, *s);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_TRUE(out->Validate().ok()) << out->Validate();
      EXPECT_EQ(ProfileMemory(*out).peak_bytes, ProfileMemory(built).peak_bytes);
      size_t built_replays = 0;
      for (const Op& op : built.ops()) built_replays += op.recompute ? 1 : 0;
      EXPECT_EQ(s->CountOf(ScheduleAction::kRecompute), built_replays);
    }
  }
}

TEST(Schedule, ValidatorAgreesWithProfileMemory) {
  const Graph forward = Gpt2Forward();
  const Graph step = *BuildTrainingStep(forward, {});
  for (CheckpointMode mode : {CheckpointMode::kOff, CheckpointMode::kFull, CheckpointMode::kSelective}) {
    const Schedule s = *SegmentSchedule(step, OnStep(step, *PlanForMode(forward, mode)));
    const PlanEvaluation e = *EvaluateSchedule(ProblemFor(step), s);
    EXPECT_TRUE(ValidateSchedule(ProblemFor(step, e.peak_bytes), s).ok());
    const absl::Status over = ValidateSchedule(ProblemFor(step, e.peak_bytes - 1), s);
    EXPECT_THAT(over.message(), HasSubstr("over the budget"));
  }
}

// Random replays sprinkled over a step: whatever the schedule, the
// validator's own simulation and ProfileMemory of the materialized graph
// agree on the peak, and pruning never raises it.
TEST(Schedule, RandomReplaysAgreeAndPruneSafely) {
  const Graph step = *BuildTrainingStep(Gpt2Forward(), {});
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    Schedule s;
    std::vector<OpId> done;
    for (const Op& op : step.ops()) {
      if (!done.empty() && rng() % 4 == 0) {
        const OpId replay = done[rng() % done.size()];
        s.entries.push_back({ScheduleAction::kRecompute, replay});
      }
      s.entries.push_back({ScheduleAction::kCompute, op.id});
      if (IsRecomputable(op)) done.push_back(op.id);
    }
    absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(ProblemFor(step), s);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE(ValidateSchedule(ProblemFor(step, e->peak_bytes), s).ok());
    EXPECT_FALSE(ValidateSchedule(ProblemFor(step, e->peak_bytes - 1), s).ok());
    const Schedule pruned = *PruneSchedule(step, s);
    const PlanEvaluation p = *EvaluateSchedule(ProblemFor(step), pruned);
    EXPECT_LE(p.peak_bytes, e->peak_bytes);
    EXPECT_LE(p.extra_cost, e->extra_cost);
  }
}

TEST(Schedule, OffloadFreesDeviceMemoryAndCostsCopyTime) {
  const Graph forward = Gpt2Forward();
  const Graph step = *BuildTrainingStep(forward, {});
  const MemoryProfile base = ProfileMemory(step);
  // Offload the largest saved activation after its last forward reader;
  // prefetch it right before its first reader after forward.
  TensorId big = kNone;
  for (const Op& op : step.ops()) {
    if (op.phase != Phase::kBackward) continue;
    for (TensorId t : op.inputs) {
      const Tensor& saved = step.tensor(t);
      if (saved.role != TensorRole::kActivation || saved.view_of != kNone) continue;
      if (big == kNone || saved.bytes() > step.tensor(big).bytes()) big = t;
    }
  }
  ASSERT_NE(big, kNone);
  OpId last_forward_use = step.producer(big);
  OpId first_backward_reader = kNone;
  for (const Op& op : step.ops()) {
    const bool reads = std::find(op.inputs.begin(), op.inputs.end(), big) != op.inputs.end();
    if (!reads) continue;
    if (op.phase == Phase::kForward || op.phase == Phase::kLoss) last_forward_use = op.id;
    else if (first_backward_reader == kNone) first_backward_reader = op.id;
  }
  ASSERT_NE(first_backward_reader, kNone);
  Schedule s;
  for (const Op& op : step.ops()) {
    if (op.id == first_backward_reader) s.entries.push_back({ScheduleAction::kPrefetch, big});
    s.entries.push_back({ScheduleAction::kCompute, op.id});
    if (op.id == last_forward_use) s.entries.push_back({ScheduleAction::kOffload, big});
  }
  PlanProblem problem = ProblemFor(step);
  problem.copy_bytes_per_cost = static_cast<double>(step.tensor(big).bytes()) / 4;  // 4 ops' time each way
  absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, s);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_LE(e->peak_bytes, base.peak_bytes);
  EXPECT_EQ(e->host_peak_bytes, step.tensor(big).bytes());
  EXPECT_EQ(e->offloaded_bytes, step.tensor(big).bytes());
  // The copy waits: 4 units out right after its last reader, and the first
  // reader after the prefetch waits for the 4 units back.
  EXPECT_GT(e->wait_cost, 0);
  EXPECT_DOUBLE_EQ(e->step_cost, e->base_cost + e->wait_cost);
  EXPECT_TRUE(ValidateSchedule({.step = &step, .op_cost = problem.op_cost, .budget = e->peak_bytes,
                                .copy_bytes_per_cost = problem.copy_bytes_per_cost},
                               s)
                  .ok());
  EXPECT_EQ(PruneSchedule(step, s)->entries.size(), s.entries.size());  // both copies are useful
  // Without a host link, copies cannot be priced.
  EXPECT_THAT(EvaluateSchedule(ProblemFor(step), s).status().message(), HasSubstr("no host-link speed"));
}

TEST(Schedule, BadSchedulesNameTheEntry) {
  const Graph step = *BuildTrainingStep(Gpt2Forward(), {});
  auto error = [&step](Schedule s) {
    const std::string materialize(MaterializeSchedule(step, s).status().message());
    const std::string validate(ValidateSchedule(ProblemFor(step), s).message());
    EXPECT_FALSE(validate.empty()) << materialize;
    return materialize;
  };
  Schedule swapped = StoreAllSchedule(step);
  std::swap(swapped.entries[1], swapped.entries[2]);
  EXPECT_THAT(error(swapped), HasSubstr("schedule entry 1 (compute 2): computes op"));

  Schedule early = StoreAllSchedule(step);
  early.entries.insert(early.entries.begin() + 1, {ScheduleAction::kRecompute, 3});
  EXPECT_THAT(error(early), HasSubstr("before it was computed"));

  Schedule backward_replay = StoreAllSchedule(step);
  backward_replay.entries.push_back({ScheduleAction::kRecompute, static_cast<OpId>(step.num_ops() - 1)});
  EXPECT_THAT(error(backward_replay), HasSubstr("only forward ops can be replayed"));

  Schedule missing = StoreAllSchedule(step);
  missing.entries.pop_back();
  EXPECT_THAT(error(missing), HasSubstr("every op must be computed once"));

  const TensorId produced = step.op(0).outputs[0];
  Schedule stray_prefetch = StoreAllSchedule(step);
  stray_prefetch.entries.push_back({ScheduleAction::kPrefetch, produced});
  EXPECT_THAT(error(stray_prefetch), HasSubstr("was not offloaded"));

  Schedule unknown = StoreAllSchedule(step);
  unknown.entries.push_back({ScheduleAction::kOffload, 1 << 30});
  EXPECT_THAT(error(unknown), HasSubstr("no tensor"));
}

// Names come from input files (a node-link graph's name and node names, a
// graph JSON's ops and tensors), so errors quote them: escaped to one line,
// no terminal escapes, and cut, not a 100 KB line (common/quote.h).
TEST(Schedule, NamesFromInputAreQuotedInErrors) {
  const std::string evil = "\x1b[31mred\nheadroom: ok" + std::string(100000, 'x');
  const std::string shown = R"('\x1b[31mred\nheadroom: ok)";
  Graph forward(evil);
  TensorId x = forward.AddTensor({.name = evil + "x", .shape = {4, 8}, .role = TensorRole::kInput});
  for (int l = 0; l < 3; ++l) {
    TensorId w = forward.AddTensor({.name = evil + "w", .shape = {8, 8}, .role = TensorRole::kParameter, .layer = l});
    TensorId h = forward.AddTensor({.name = evil + "h", .shape = {4, 8}, .layer = l});
    TensorId a = forward.AddTensor({.name = evil + "a", .shape = {4, 8}, .layer = l});
    forward.AddOp({.kind = "linear", .name = evil + "fc", .inputs = {x, w}, .outputs = {h}, .saved = {x}, .layer = l});
    forward.AddOp({.kind = "gelu", .name = evil + "act", .inputs = {h}, .outputs = {a}, .saved = {h}, .layer = l});
    x = a;
  }
  TensorId loss = forward.AddTensor({.name = evil + "loss", .shape = {}});
  forward.AddOp({.kind = "sum", .name = evil + "loss", .inputs = {x}, .outputs = {loss}, .phase = Phase::kLoss});
  const absl::StatusOr<Graph> built = BuildTrainingStep(forward, {});
  ASSERT_TRUE(built.ok()) << built.status().message().substr(0, 200);
  const Graph& step = *built;

  auto expect_quoted = [&](const absl::Status& status, std::string_view what) {
    const std::string message(status.message());
    EXPECT_FALSE(status.ok()) << what;
    EXPECT_THAT(message, HasSubstr(shown)) << what;
    EXPECT_THAT(message, HasSubstr("...' (1000")) << what;  // cut, with the name's size
    EXPECT_EQ(message.find('\n'), std::string::npos) << what;
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << what;
    EXPECT_LT(message.size(), 1000u) << what << ": " << message.substr(0, 200);
  };
  Schedule missing = StoreAllSchedule(step);
  missing.entries.pop_back();
  expect_quoted(MaterializeSchedule(step, missing).status(), "MaterializeSchedule");
  expect_quoted(ValidateSchedule(ProblemFor(step), missing), "ValidateSchedule");
  Schedule swapped = StoreAllSchedule(step);
  std::swap(swapped.entries[1], swapped.entries[2]);
  expect_quoted(MaterializeSchedule(step, swapped).status(), "out of program order");
  Schedule stray_prefetch = StoreAllSchedule(step);
  stray_prefetch.entries.push_back({ScheduleAction::kPrefetch, step.op(0).outputs[0]});
  expect_quoted(MaterializeSchedule(step, stray_prefetch).status(), "stray prefetch");

  PlanProblem negative = ProblemFor(step);
  negative.op_cost[0] = -1;
  expect_quoted(ValidateProblem(negative), "ValidateProblem");
  PlanProblem tiny = ProblemFor(step, 1);
  expect_quoted(RunStrategy(tiny, Strategy::kOptimal).status(), "optimal");
  expect_quoted(RunStrategy(tiny, Strategy::kChenGreedy).status(), "chen-greedy");
  expect_quoted(RunStrategy(tiny, Strategy::kOffload).status(), "offload without a host link");
  tiny.copy_bytes_per_cost = 64;
  expect_quoted(RunStrategy(tiny, Strategy::kOffload).status(), "offload");
  expect_quoted(RunAutomaticStrategy(tiny).status(), "auto");
}

TEST(Schedule, ActionNames) {
  EXPECT_EQ(ScheduleActionName(ScheduleAction::kPrefetch), "prefetch");
  EXPECT_EQ(*ParseScheduleAction("recompute"), ScheduleAction::kRecompute);
  EXPECT_FALSE(ParseScheduleAction("evict").ok());
}

}  // namespace
}  // namespace headroom
