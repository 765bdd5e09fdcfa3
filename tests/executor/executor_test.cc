#include "executor/executor.h"

#include <cmath>
#include <string>
#include <vector>

#include "allocator/alloc_conf.h"
#include "executor/compute_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/executor/plan_for_test.h"

namespace headroom {
namespace {

using ::headroom::testing::Planned;
using ::headroom::testing::Trained;
using ::testing::HasSubstr;

Planned Plan(const DemoModel& model, Strategy strategy, double fraction, const JobSpec& job = DemoJob()) {
  return ::headroom::testing::PlanForTest(model, strategy, fraction, job);
}

DemoModel TinyGpt() {
  return *BuildDemoGpt({.batch = 2, .seq = 8, .vocab = 16, .hidden = 16, .heads = 2, .layers = 2});
}
DemoModel TinyMlp() { return *BuildDemoMlp({.batch = 8, .inputs = 6, .hidden = 24, .layers = 6, .classes = 4}); }

// A run with the allocator validated after every allocation and free.
Trained Execute(const DemoModel& model, const Planned& p, int steps, ExecutorOptions options = {}) {
  options.validate_allocator = true;
  return ::headroom::testing::TrainForTest(model, p, steps, options);
}

// What the plan predicts: ReplayPlan over its materialized schedule.
PlanReplay Predict(const Planned& p) {
  absl::StatusOr<Graph> scheduled = MaterializeSchedule(p.in.step, p.plan.schedule);
  EXPECT_TRUE(scheduled.ok()) << scheduled.status();
  absl::StatusOr<PlanReplay> replay = ReplayPlan(p.in, *scheduled);
  EXPECT_TRUE(replay.ok()) << replay.status();
  return replay.ok() ? *replay : PlanReplay{};
}

class EveryStrategy : public ::testing::TestWithParam<::headroom::testing::ModelAndStrategy> {};

// The acceptance test of the executor: under every strategy's plan the step
// computes bitwise the gradients that store-all computes, the allocator's
// requested, allocated and reserved peaks are what ReplayPlan predicts, and
// the host pool's peak is what the plan's evaluation predicts.
TEST_P(EveryStrategy, GradientsMatchStoreAllAndMemoryMatchesThePrediction) {
  const auto& [name, strategy] = GetParam();
  const DemoModel model = name == "gpt" ? TinyGpt() : TinyMlp();
  // The prediction covers the steps until the cache settles (Note [The first step in the replay]); one more
  // step must not grow it.
  constexpr int kSteps = kStepsUntilSettled + 1;
  const Trained reference = Execute(model, Plan(model, Strategy::kStoreAll, 1.0), kSteps);
  const Planned planned = Plan(model, strategy, 0.25);
  const Trained run = Execute(model, planned, kSteps);
  // The plan does replay or offload something, so the test compares two different executions.
  const Schedule& schedule = planned.plan.schedule;
  if (strategy != Strategy::kStoreAll) {
    EXPECT_GT(schedule.CountOf(ScheduleAction::kRecompute) + schedule.CountOf(ScheduleAction::kOffload), 0u);
  }
  if (strategy == Strategy::kOffload) {
    EXPECT_GT(schedule.CountOf(ScheduleAction::kPrefetch), 0u);
  }
  ASSERT_EQ(run.steps.size(), size_t{kSteps});
  ASSERT_EQ(reference.steps.size(), size_t{kSteps});
  EXPECT_EQ(run.steps.back().loss, reference.steps.back().loss);
  ASSERT_EQ(run.gradients.size(), reference.gradients.size());
  for (size_t p = 0; p < run.gradients.size(); ++p) {
    EXPECT_EQ(run.gradients[p], reference.gradients[p]) << model.forward.tensor(static_cast<TensorId>(p)).name;
  }
  const PlanReplay predicted = Predict(planned);
  const StepResult& settled = run.steps[kStepsUntilSettled - 1];  // its statistics cover the steps so far
  EXPECT_EQ(settled.peak_requested_bytes, predicted.requested_bytes);
  EXPECT_EQ(settled.peak_allocated_bytes, predicted.allocator.peak_allocated_bytes);
  EXPECT_EQ(settled.peak_reserved_bytes, predicted.allocator.peak_reserved_bytes);
  EXPECT_EQ(settled.host_peak_bytes, planned.plan.evaluation.host_peak_bytes);
  // A later step reuses the cache: nothing grows.
  EXPECT_EQ(run.steps.back().peak_reserved_bytes, settled.peak_reserved_bytes);
}

INSTANTIATE_TEST_SUITE_P(Executor, EveryStrategy, ::testing::ValuesIn(::headroom::testing::EveryModelAndStrategy()),
                         ::headroom::testing::ModelAndStrategyName);

// The backward kernels against the loss itself: central differences of the
// step's loss (learning rate 0) at a few entries of every parameter.
TEST(ExecutorGradients, MatchFiniteDifferencesOfTheLoss) {
  // The tied GPT's embedding table sums two contributions into a fresh gradient.
  DemoModel tied = *BuildDemoGpt({.batch = 2, .seq = 8, .vocab = 16, .hidden = 16, .heads = 2, .layers = 2,
                                  .tie_head = true});
  tied.name = "demo-gpt (tied head)";
  for (const DemoModel& model : {TinyMlp(), TinyGpt(), tied}) {
    SCOPED_TRACE(model.name);
    const Planned p = Plan(model, Strategy::kStoreAll, 1.0);
    auto executor = *PlanExecutor::Create(model, p.in, p.plan.schedule,
                                          {.learning_rate = 0, .momentum = 0, .record_gradients = true});
    const DemoBatch batch = model.MakeBatch(3);
    ASSERT_TRUE(executor->RunStep(batch).ok());
    const std::vector<std::vector<float>> gradients = executor->last_gradients();
    const auto loss_at = [&](TensorId t, const std::vector<float>& values) {
      EXPECT_TRUE(executor->SetParameterValues(t, values).ok());
      return static_cast<double>(executor->RunStep(batch)->loss);
    };
    int checked = 0;
    for (const Tensor& t : model.forward.tensors()) {
      if (t.role != TensorRole::kParameter) continue;
      const std::vector<float> original = *executor->ParameterValues(t.id);
      for (size_t i : {size_t{0}, original.size() / 2, original.size() - 1}) {
        constexpr float kEps = 1e-2f;
        std::vector<float> moved = original;
        moved[i] = original[i] + kEps;
        const double up = loss_at(t.id, moved);
        moved[i] = original[i] - kEps;
        const double down = loss_at(t.id, moved);
        const double numeric = (up - down) / (2 * static_cast<double>(kEps));
        const double analytic = gradients[static_cast<size_t>(t.id)][i];
        EXPECT_NEAR(analytic, numeric, 2e-3 + 0.05 * std::abs(numeric)) << t.name << "[" << i << "]";
        ++checked;
      }
      ASSERT_TRUE(executor->SetParameterValues(t.id, original).ok());
    }
    EXPECT_GT(checked, 20);
  }
}

// The allocator's other policies: the run reserves what the replay predicts
// (expandable segments compute in host memory mapped page by page).
TEST(ExecutorAllocatorPolicies, ReserveWhatTheReplayPredicts) {
  for (const char* conf : {"expandable_segments:True", "roundup_power2_divisions:4",
                           "expandable_segments:True,roundup_power2_divisions:2"}) {
    SCOPED_TRACE(conf);
    const DemoModel model = *BuildDemoGpt({.batch = 4, .seq = 32, .vocab = 64, .hidden = 64, .heads = 4, .layers = 3});
    const absl::StatusOr<AllocatorOptions> options = ParseAllocConf(conf);
    ASSERT_TRUE(options.ok()) << options.status();
    const Planned planned = Plan(model, Strategy::kHybrid, 0.25, DemoJob(*options));
    const Trained run = Execute(model, planned, kStepsUntilSettled);
    ASSERT_EQ(run.steps.size(), size_t{kStepsUntilSettled});
    const PlanReplay predicted = Predict(planned);
    EXPECT_EQ(run.steps.back().peak_requested_bytes, predicted.requested_bytes);
    EXPECT_EQ(run.steps.back().peak_allocated_bytes, predicted.allocator.peak_allocated_bytes);
    EXPECT_EQ(run.steps.back().peak_reserved_bytes, predicted.allocator.peak_reserved_bytes);
  }
}

// Copies that lag behind compute (Note [Executor copies]): an offloaded
// tensor's block returns to the allocator only once its copy is done, here
// only at the step's end, so the step cannot reuse those blocks (they stay
// active, not allocated) and may reserve more than the replay, which assumes
// copies keep up, predicts. The values are the same all the same.
TEST(ExecutorCopies, LaggingCopiesKeepBlocksFromReuseButChangeNoValue) {
  // Sequences long enough that the offloaded scores are blocks of the large pool (over 1 MiB).
  const DemoModel model = *BuildDemoGpt({.batch = 4, .seq = 128, .vocab = 32, .hidden = 32, .heads = 8, .layers = 2});
  const Planned planned = Plan(model, Strategy::kOffload, 0.25);
  ASSERT_GT(planned.plan.schedule.CountOf(ScheduleAction::kOffload), 0u);
  const Trained prompt = Execute(model, planned, 2);
  auto executor = *PlanExecutor::Create(model, planned.in, planned.plan.schedule,
                                        {.validate_allocator = true, .record_gradients = true},
                                        *CpuComputeDevice::Create(uint64_t{80} << 30, /*copies_complete_at_once=*/false));
  const StepResult first = *executor->RunStep(model.MakeBatch(0));
  const StepResult second = *executor->RunStep(model.MakeBatch(1));
  EXPECT_EQ(second.loss, prompt.steps[1].loss);
  EXPECT_EQ(executor->last_gradients(), prompt.gradients);
  EXPECT_EQ(first.peak_requested_bytes, prompt.steps[0].peak_requested_bytes);  // requests are the same
  // Blocks the copies still use are active but not allocated: the allocator cannot hand them out.
  EXPECT_EQ(prompt.steps[0].peak_active_bytes, prompt.steps[0].peak_allocated_bytes);
  EXPECT_GT(first.peak_active_bytes, first.peak_allocated_bytes + (1 << 20));
  EXPECT_GE(first.peak_reserved_bytes, prompt.steps[0].peak_reserved_bytes);
  EXPECT_EQ(first.host_peak_bytes, prompt.steps[0].host_peak_bytes);
}

TEST(ExecutorTraining, LossGoesDown) {
  const DemoModel model = TinyGpt();
  const Planned p = Plan(model, Strategy::kHybrid, 0.25);
  const Trained run = Execute(model, p, 30, {});
  ASSERT_EQ(run.steps.size(), 30u);
  EXPECT_LT(run.steps.back().loss, 0.5f * run.steps.front().loss);
}

TEST(ExecutorErrors, RefuseWhatTheKernelsDoNotRun) {
  const DemoModel model = TinyMlp();
  absl::StatusOr<PlanInput> adam = DemoPlanInput(
      model, [] { JobSpec job = DemoJob(); job.optimizer = Optimizer::kAdamW; return job; }(), uint64_t{1} << 30);
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_THAT(PlanExecutor::Create(model, *adam, StoreAllSchedule(adam->step), {}).status().message(),
              HasSubstr("sgd-momentum"));
  absl::StatusOr<PlanInput> bf16 = DemoPlanInput(
      model, [] { JobSpec job = DemoJob(); job.precision = Precision::kBf16; return job; }(), uint64_t{1} << 30);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_THAT(PlanExecutor::Create(model, *bf16, StoreAllSchedule(bf16->step), {}).status().message(),
              HasSubstr("fp32"));
  const Planned p = Plan(model, Strategy::kStoreAll, 1.0);
  Schedule truncated = p.plan.schedule;
  truncated.entries.pop_back();
  EXPECT_THAT(PlanExecutor::Create(model, p.in, truncated, {}).status().message(), HasSubstr("every op"));
  EXPECT_THAT(PlanExecutor::Create(model, p.in, p.plan.schedule, {.learning_rate = std::nanf("")}).status().message(),
              HasSubstr("learning rate nan"));
  EXPECT_FALSE(PlanExecutor::Create(model, p.in, p.plan.schedule, {.momentum = 1.5f}).ok());
  auto executor = *PlanExecutor::Create(model, p.in, p.plan.schedule, {});
  DemoBatch batch = model.MakeBatch(0);
  batch.labels[2] = 99;
  EXPECT_THAT(executor->RunStep(batch).status().message(), HasSubstr("label 99"));
  batch.labels[2] = 0;
  batch.labels.pop_back();
  EXPECT_THAT(executor->RunStep(batch).status().message(), HasSubstr("for 'labels' of 8"));
  EXPECT_TRUE(executor->RunStep(model.MakeBatch(0)).ok());  // refused batches changed nothing
  EXPECT_FALSE(executor->SetParameterValues(model.labels, {}).ok());
}

// A device too small for the plan: the step fails with the allocator's
// out-of-memory error naming the tensor, and later steps are refused.
TEST(ExecutorErrors, OutOfMemoryMidwayStopsTheExecutor) {
  const DemoModel model = *BuildDemoGpt({});  // 1.6 MiB of weights and momentum, 4 MiB reserved in all
  const Planned p = Plan(model, Strategy::kStoreAll, 1.0);
  absl::StatusOr<std::unique_ptr<PlanExecutor>> made =
      PlanExecutor::Create(model, p.in, p.plan.schedule, {.device_bytes = 2 << 20});
  ASSERT_TRUE(made.ok()) << made.status();  // the resident state fits in 2 MiB
  auto& executor = *made;
  const absl::StatusOr<StepResult> first = executor->RunStep(model.MakeBatch(0));
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(first.status().message(), HasSubstr("executor: allocating '"));
  EXPECT_EQ(executor->RunStep(model.MakeBatch(1)).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace headroom
