// Plans read back per layer: the named checkpoint modes come out as the
// treatments they stand for, segments group as the plan replays them, a
// hybrid plan's offloads are seen, and a graph without layers is refused.
#include "report/layer_plan.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/report/stack_plans.h"

namespace headroom {
namespace {

using ::headroom::testing::BuildForward;
using ::headroom::testing::Classified;
using ::headroom::testing::Gpt2Problem;
using ::headroom::testing::Gpt2Step;
using ::headroom::testing::HybridSchedule;
using ::headroom::testing::LayersSchedule;
using ::headroom::testing::ModeSchedule;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int> SegmentLengths(const StackPlan& plan) {
  std::vector<int> out;
  for (const CheckpointSegment& s : plan.segments) out.push_back(s.num_layers);
  return out;
}

TEST(ClassifyStack, StoreAllKeepsEveryLayer) {
  const StackPlan plan = Classified(StoreAllSchedule(Gpt2Step()));
  ASSERT_EQ(plan.layers.size(), 4u);
  for (const LayerPlan& l : plan.layers) {
    EXPECT_EQ(l.treatment, LayerTreatment::kKeep) << l.layer;
    EXPECT_TRUE(l.exact);
    EXPECT_GT(l.own.kept, 0u);
    EXPECT_EQ(l.own.recomputed + l.own.offloaded, 0u);
    EXPECT_EQ(l.input, InputFate::kKept);
  }
  EXPECT_TRUE(plan.segments.empty());
  EXPECT_EQ(plan.all.kept, plan.all.total());
  EXPECT_FALSE(plan.UniformFull());
}

TEST(ClassifyStack, ModulePathsComeFromOpNames) {
  const StackPlan gpt2 = Classified(StoreAllSchedule(Gpt2Step()));
  EXPECT_EQ(gpt2.layers[2].module, "transformer.h.2");
  const Graph llama = *BuildTrainingStep(BuildForward("llama-2-7b"), {});
  const StackPlan plan = Classified(StoreAllSchedule(llama), llama);
  EXPECT_EQ(plan.layers[3].module, "model.layers.3");
}

// PlanForMode(kFull): torch.utils.checkpoint around each layer.
TEST(ClassifyStack, FullCheckpointIsOneSegmentPerLayer) {
  const StackPlan plan = Classified(ModeSchedule(CheckpointMode::kFull));
  for (const LayerPlan& l : plan.layers) {
    EXPECT_EQ(l.treatment, LayerTreatment::kFull) << l.layer;
    EXPECT_TRUE(l.exact) << l.layer << ": keeps " << l.own.kept;
    EXPECT_EQ(l.own.kept, 0u);
    EXPECT_EQ(l.input, InputFate::kKept);  // each checkpoint keeps its input
    EXPECT_GT(l.replayed_ops, 0u);
  }
  EXPECT_THAT(SegmentLengths(plan), ElementsAre(1, 1, 1, 1));
  EXPECT_TRUE(plan.UniformFull());
  EXPECT_EQ(plan.outside_replayed_ops, 0u);
  EXPECT_LT(plan.all.kept, plan.all.total());
}

// kEveryK with k = 2: two segments of two layers; the second layer of each
// replays from the first one's replayed output.
TEST(ClassifyStack, EveryTwoLayersGroupsSegments) {
  const StackPlan plan = Classified(ModeSchedule(CheckpointMode::kEveryK, 2));
  EXPECT_EQ(plan.LayersWith(LayerTreatment::kFull).size(), 4u);
  EXPECT_THAT(SegmentLengths(plan), ElementsAre(2, 2));
  EXPECT_EQ(plan.segments[1].first_layer, 2);
  EXPECT_EQ(plan.layers[1].input, InputFate::kRecomputed);
  EXPECT_EQ(plan.layers[2].input, InputFate::kKept);
  EXPECT_FALSE(plan.UniformFull());
  // It keeps less than one checkpoint per layer: the inner layers' inputs.
  const StackPlan per_layer = Classified(ModeSchedule(CheckpointMode::kFull));
  EXPECT_LT(plan.all.kept, per_layer.all.kept);
}

// Korthikanti et al.'s selective recomputation: only the attention core.
TEST(ClassifyStack, SelectiveReplaysOnlyTheAttentionCore) {
  const StackPlan plan = Classified(ModeSchedule(CheckpointMode::kSelective));
  for (const LayerPlan& l : plan.layers) {
    EXPECT_EQ(l.treatment, LayerTreatment::kSelective) << l.layer;
    EXPECT_TRUE(l.exact) << l.layer;
    EXPECT_GT(l.core.recomputed, 0u);
    EXPECT_EQ(l.own.recomputed, l.core.recomputed);
    EXPECT_GT(l.own.kept, 0u);  // projections, norms, MLP
  }
  EXPECT_TRUE(plan.segments.empty());
}

// With flash attention the builders mark no core, so a selective plan is
// empty and every layer keeps its activations.
TEST(ClassifyStack, FlashAttentionLeavesNothingSelective) {
  const Graph forward = BuildForward("gpt2", AttentionImpl::kFlash);
  const Graph step = *BuildTrainingStep(forward, {});
  CheckpointPlan plan = *PlanForMode(forward, CheckpointMode::kSelective);
  if (!plan.segment_of_op.empty()) plan.segment_of_op.resize(step.num_ops(), kNone);
  const StackPlan stack = Classified(*SegmentSchedule(step, plan), step);
  EXPECT_EQ(stack.LayersWith(LayerTreatment::kKeep).size(), 4u);
}

TEST(ClassifyStack, ChosenLayersCheckpointed) {
  const StackPlan plan = Classified(LayersSchedule({1, 3}));
  EXPECT_THAT(plan.LayersWith(LayerTreatment::kFull), ElementsAre(1, 3));
  EXPECT_THAT(plan.LayersWith(LayerTreatment::kKeep), ElementsAre(0, 2));
  EXPECT_THAT(SegmentLengths(plan), ElementsAre(1, 1));
  EXPECT_EQ(LayerRanges(plan.LayersWith(LayerTreatment::kFull)), "1, 3");
}

// A hybrid plan on a fast link offloads; the offloaded bytes are found per
// layer, and the whole step's split adds up.
TEST(ClassifyStack, HybridPlanOffloads) {
  const Schedule schedule = HybridSchedule();
  ASSERT_GT(schedule.CountOf(ScheduleAction::kPrefetch), 0u);
  const StackPlan plan = Classified(schedule);
  EXPECT_GT(plan.all.offloaded, 0u);
  uint64_t per_layer_offloaded = 0;
  for (const LayerPlan& l : plan.layers) {
    per_layer_offloaded += l.own.offloaded + (l.input == InputFate::kOffloaded ? l.input_bytes : 0);
    if (l.treatment == LayerTreatment::kOffload) {
      EXPECT_GT(l.own.offloaded, 0u) << l.layer;
    }
  }
  EXPECT_LE(per_layer_offloaded + plan.outside.offloaded, plan.all.offloaded);
  EXPECT_FALSE(plan.LayersWith(LayerTreatment::kOffload).empty());
  EXPECT_FALSE(plan.UniformFull());
}

// A hand-made schedule that offloads the kept input of a checkpointed
// layer: the segment's input lives in host memory (DeepSpeed's
// cpu_checkpointing).
TEST(ClassifyStack, OffloadedCheckpointInput) {
  const Graph& step = Gpt2Step();
  const Schedule full = ModeSchedule(CheckpointMode::kFull);
  const StackPlan before = Classified(full);
  // Layer 2's input: the storage layer 1 makes that layer 2's forward reads.
  TensorId input = kNone;
  for (const Op& op : step.ops()) {
    if (op.layer != 2 || op.phase != Phase::kForward) continue;
    for (TensorId in : op.inputs) {
      const OpId p = step.producer(step.storage(in));
      if (p != kNone && step.op(p).layer == 1) input = step.storage(in);
    }
    if (input != kNone) break;
  }
  ASSERT_NE(input, kNone);
  // Offload it after its last forward-side reader, prefetch it before the
  // first entry after the forward side that reads it.
  auto reads = [&step, input](const ScheduleEntry& e) {
    if (e.action != ScheduleAction::kCompute && e.action != ScheduleAction::kRecompute) return false;
    for (TensorId in : step.op(e.target).inputs) {
      if (step.storage(in) == input) return true;
    }
    return false;
  };
  size_t backward_start = 0, last_forward_read = 0, first_later_read = 0;
  for (size_t i = 0; i < full.entries.size(); ++i) {
    const ScheduleEntry& e = full.entries[i];
    if (backward_start == 0 && e.action == ScheduleAction::kCompute && !IsForwardPhase(step.op(e.target).phase)) {
      backward_start = i;
    }
    if (!reads(e)) continue;
    if (backward_start == 0) last_forward_read = i;
    if (backward_start != 0 && first_later_read == 0) first_later_read = i;
  }
  ASSERT_GT(first_later_read, last_forward_read);
  Schedule s;
  for (size_t i = 0; i < full.entries.size(); ++i) {
    if (i == first_later_read) s.entries.push_back({ScheduleAction::kPrefetch, input});
    s.entries.push_back(full.entries[i]);
    if (i == last_forward_read) s.entries.push_back({ScheduleAction::kOffload, input});
  }
  const StackPlan plan = Classified(s);
  EXPECT_EQ(plan.layers[2].input, InputFate::kOffloaded);
  EXPECT_EQ(plan.layers[2].treatment, LayerTreatment::kFull);
  ASSERT_EQ(plan.segments.size(), 4u);
  EXPECT_TRUE(plan.segments[2].input_offloaded);
  EXPECT_FALSE(plan.segments[1].input_offloaded);
  EXPECT_EQ(plan.all.offloaded, before.all.offloaded + step.tensor(input).bytes());
  EXPECT_FALSE(plan.UniformFull());
}

// Whatever a strategy chooses, the classification holds together.
TEST(ClassifyStack, EveryStrategyClassifies) {
  PlanProblem problem = Gpt2Problem(0.6, /*copy_ops=*/3);
  for (Strategy strategy : AllStrategies()) {
    absl::StatusOr<PlanResult> r = RunStrategy(problem, strategy);
    if (!r.ok()) continue;  // a budget this strategy cannot meet
    SCOPED_TRACE(std::string(StrategyName(strategy)));
    const StackPlan plan = Classified(r->schedule);
    EXPECT_EQ(plan.layers.size(), 4u);
    EXPECT_EQ(plan.all.recomputed > 0, r->schedule.CountOf(ScheduleAction::kRecompute) > 0);
    EXPECT_EQ(plan.all.offloaded > 0, r->schedule.CountOf(ScheduleAction::kPrefetch) > 0);
    EXPECT_EQ(plan.all.kept == plan.all.total(), strategy == Strategy::kStoreAll);
  }
}

TEST(ClassifyStack, GraphWithoutLayersIsRefused) {
  Graph flat("flat");
  for (const Tensor& t : Gpt2Step().tensors()) flat.AddTensor(t);
  for (Op op : Gpt2Step().ops()) {
    op.id = kNone;
    op.layer = -1;
    flat.AddOp(std::move(op));
  }
  absl::StatusOr<StackPlan> plan = ClassifyStack(flat, StoreAllSchedule(flat));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(), HasSubstr("'flat' has no layers"));
}

TEST(ClassifyStack, BadScheduleIsRefused) {
  Schedule s = StoreAllSchedule(Gpt2Step());
  s.entries.pop_back();
  EXPECT_FALSE(ClassifyStack(Gpt2Step(), s).ok());
}

TEST(LayerRanges, CollapsesRuns) {
  EXPECT_EQ(LayerRanges({}), "");
  EXPECT_EQ(LayerRanges({0, 1, 2, 5, 7, 8}), "0-2, 5, 7-8");
}

}  // namespace
}  // namespace headroom
