// The plan of each named checkpoint mode over a hand-built stack of layers,
// and the plan invariants the step builder relies on.
#include "planner/checkpoint_mode_plan.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// `layers` layers of two ops each (fc, act), then a loss outside any layer.
Graph Stack(int layers, bool attention_core = false) {
  Graph g("stack");
  TensorId x = g.AddTensor({.name = "x", .shape = {4, 8}, .role = TensorRole::kInput});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "l" + std::to_string(l);
    TensorId w = g.AddTensor({.name = p + ".w", .shape = {8, 8}, .role = TensorRole::kParameter, .layer = l});
    TensorId h = g.AddTensor({.name = p + ".h", .shape = {4, 8}, .layer = l});
    TensorId a = g.AddTensor({.name = p + ".a", .shape = {4, 8}, .layer = l});
    g.AddOp({.kind = "linear", .name = p + ".fc", .inputs = {x, w}, .outputs = {h}, .saved = {x}, .layer = l});
    g.AddOp({.kind = "gelu", .name = p + ".act", .inputs = {h}, .outputs = {a}, .saved = {h}, .layer = l,
             .attention_core = attention_core});
    x = a;
  }
  TensorId loss = g.AddTensor({.name = "loss", .shape = {}});
  g.AddOp({.kind = "sum", .name = "loss", .inputs = {x}, .outputs = {loss}, .phase = Phase::kLoss});
  return g;
}

std::vector<int32_t> Segments(const Graph& g, CheckpointMode mode, int every = 1) {
  absl::StatusOr<CheckpointPlan> plan = PlanForMode(g, mode, every);
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->Validate(g).ok());
  return plan->segment_of_op;
}

constexpr int32_t N = kNone;

TEST(CheckpointPlan, NamedModes) {
  const Graph g = Stack(5);
  EXPECT_TRUE(PlanForMode(g, CheckpointMode::kOff)->empty());
  EXPECT_THAT(Segments(g, CheckpointMode::kFull), ElementsAreArray({0, 0, 1, 1, 2, 2, 3, 3, 4, 4, N}));
  EXPECT_THAT(Segments(g, CheckpointMode::kEveryK, 2), ElementsAreArray({0, 0, 0, 0, 1, 1, 1, 1, 2, 2, N}));
  // ceil(sqrt(5)) = 3 layers per segment: layers {0, 1, 2} and {3, 4}.
  EXPECT_THAT(Segments(g, CheckpointMode::kSqrtN), ElementsAreArray({0, 0, 0, 0, 0, 0, 1, 1, 1, 1, N}));
  EXPECT_EQ(PlanForMode(g, CheckpointMode::kSqrtN)->num_segments(), 2);
  // Selective takes only the ops marked as attention core, one segment per layer.
  EXPECT_TRUE(PlanForMode(g, CheckpointMode::kSelective)->empty());
  const Graph core = Stack(2, /*attention_core=*/true);
  EXPECT_THAT(Segments(core, CheckpointMode::kSelective), ElementsAreArray({N, 0, N, 1, N}));
}

TEST(CheckpointPlan, EveryKOfOneIsFull) {
  const Graph g = Stack(4);
  EXPECT_EQ(Segments(g, CheckpointMode::kEveryK, 1), Segments(g, CheckpointMode::kFull));
  EXPECT_THAT(PlanForMode(g, CheckpointMode::kEveryK, 0).status().message(),
              HasSubstr("checkpoint_every must be at least 1"));
}

TEST(CheckpointPlan, ValidateRejectsPlansThatDoNotFitTheGraph) {
  const Graph g = Stack(2);
  auto error = [&g](std::vector<int32_t> segments) {
    return std::string(CheckpointPlan{.segment_of_op = std::move(segments)}.Validate(g).message());
  };
  EXPECT_THAT(error({0, 0}), HasSubstr("covers 2 ops"));
  // Segment 1 before segment 0.
  EXPECT_THAT(error({1, 1, 0, 0, N}), HasSubstr("opens segment 1 where segment 0 was expected"));
  // A segment split in two runs.
  EXPECT_THAT(error({0, N, 0, N, N}), HasSubstr("opens segment 0 where segment 1 was expected"));
  // The loss is not a forward op to replay.
  EXPECT_THAT(error({N, N, N, N, 0}), HasSubstr("only forward ops are replayed"));
  // The step builder refuses such plans, and plans for inference.
  EXPECT_FALSE(BuildTrainingStep(g, {.checkpoint = {.segment_of_op = {1, 1, 0, 0, N}}}).ok());
  EXPECT_THAT(BuildTrainingStep(g, {.training = false, .checkpoint = *PlanForMode(g, CheckpointMode::kFull)})
                  .status()
                  .message(),
              HasSubstr("a checkpoint plan applies to training"));
}

// A plan that is not one of the named modes runs too: the planner's search
// results are plans of this kind.
TEST(CheckpointPlan, AnyValidPlanDrivesTheStep) {
  const Graph g = Stack(3);
  absl::StatusOr<Graph> step = BuildTrainingStep(g, {.checkpoint = {.segment_of_op = {N, N, 0, 0, N, N, N}}});
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<std::string> replayed;
  for (const Op& op : step->ops()) {
    if (op.recompute) replayed.push_back(op.name);
  }
  // Layer 1's act saves h, which its fc makes: only the fc is replayed.
  EXPECT_EQ(replayed, std::vector<std::string>{"l1.fc"});
}

}  // namespace
}  // namespace headroom
