// The budget loop of Note [Plan budget] (estimators/plan_input.h): the plan
// made for the budget it finds, replayed through the allocator after the
// fixed state, fits the GPU.
#include "estimators/plan_input.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hardware/gpu_catalog.h"
#include "planner/planner.h"
#include "planner/schedule.h"

namespace headroom {
namespace {

TEST(PlanBudget, ThePlanForTheBudgetFoundReplaysWithinTheGpu) {
  absl::StatusOr<LoadedModel> model = LoadModel("gpt2");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<const GpuSpec*> t4 = GpuCatalog::Builtin().Find("T4");
  ASSERT_TRUE(t4.ok()) << t4.status();
  // Twelve sequences of 1024 tokens: the allocator's rounding and cache take part of what the fixed state leaves.
  absl::StatusOr<PlanInput> in = BuildPlanInput(*model, {.micro_batch = 12}, {.gpu = *t4});
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_TRUE(in->gpu_budget.has_value());

  absl::StatusOr<uint64_t> budget = BudgetThatReplaysWithinTheGpu(*in, Strategy::kHybrid);
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_GT(*budget, 0u);
  EXPECT_LT(*budget, *in->gpu_budget);
  absl::StatusOr<PlanResult> plan = RunStrategy(in->Problem(*budget), Strategy::kHybrid);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<Graph> scheduled = MaterializeSchedule(in->step, plan->schedule);
  ASSERT_TRUE(scheduled.ok()) << scheduled.status();
  absl::StatusOr<PlanReplay> replay = ReplayPlan(*in, *scheduled);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_LE(replay->total_bytes(), in->capacity);
  EXPECT_FALSE(replay->allocator.out_of_memory);

  // Without a GPU budget (the fixed state fills the GPU) there is nothing to lower.
  PlanInput full = *std::move(in);
  full.gpu_budget.reset();
  EXPECT_EQ(BudgetThatReplaysWithinTheGpu(full, Strategy::kHybrid).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace headroom
