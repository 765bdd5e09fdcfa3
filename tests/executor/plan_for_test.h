// A plan that must do something, and a run of it, for the executor's tests (CPU and GPU).
#ifndef HEADROOM_TESTS_EXECUTOR_PLAN_FOR_TEST_H_
#define HEADROOM_TESTS_EXECUTOR_PLAN_FOR_TEST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "executor/executor.h"
#include "gtest/gtest.h"
#include "planner/planner.h"

namespace headroom::testing {

struct Planned {
  PlanInput in;
  PlanResult plan;
};

// A plan of `strategy` under `job` for a budget `fraction` of the way from
// the smallest peak the strategy reaches to the store-all peak, so that it
// must replay or offload something (store-all and sqrt-n plan regardless).
inline Planned PlanForTest(const DemoModel& model, Strategy strategy, double fraction,
                           const JobSpec& job = DemoJob()) {
  absl::StatusOr<PlanInput> in = DemoPlanInput(model, job, uint64_t{80} << 30);
  EXPECT_TRUE(in.ok()) << in.status();
  Planned p{.in = std::move(*in)};
  const absl::StatusOr<PlanEvaluation> store_all =
      EvaluateSchedule(p.in.Problem(uint64_t{1} << 40), StoreAllSchedule(p.in.step));
  EXPECT_TRUE(store_all.ok()) << store_all.status();
  const absl::StatusOr<uint64_t> smallest = SmallestPeak(p.in.Problem(store_all->peak_bytes), strategy);
  EXPECT_TRUE(smallest.ok()) << smallest.status();
  const auto budget =
      *smallest + static_cast<uint64_t>(fraction * static_cast<double>(store_all->peak_bytes - *smallest));
  absl::StatusOr<PlanResult> plan = RunStrategy(p.in.Problem(budget), strategy);
  EXPECT_TRUE(plan.ok()) << StrategyName(strategy) << ": " << plan.status();
  if (plan.ok()) p.plan = std::move(*plan);
  return p;
}

struct Trained {
  std::vector<StepResult> steps;
  std::vector<std::vector<float>> gradients;  // of the last step, by parameter
};

// `steps` steps of `p` on `device` (the CPU reference when null), recording gradients; stops at the first error.
inline Trained TrainForTest(const DemoModel& model, const Planned& p, int steps, ExecutorOptions options,
                            std::unique_ptr<ComputeDevice> device = nullptr) {
  options.record_gradients = true;
  absl::StatusOr<std::unique_ptr<PlanExecutor>> executor =
      PlanExecutor::Create(model, p.in, p.plan.schedule, options, std::move(device));
  EXPECT_TRUE(executor.ok()) << executor.status();
  Trained run;
  if (!executor.ok()) return run;
  for (int s = 0; s < steps; ++s) {
    absl::StatusOr<StepResult> r = (*executor)->RunStep(model.MakeBatch(s));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return run;
    run.steps.push_back(*r);
  }
  run.gradients = (*executor)->last_gradients();
  return run;
}

// Every (demo model, strategy) pair, and its test name, for the suites that run every strategy.
using ModelAndStrategy = std::tuple<std::string, Strategy>;

inline std::vector<ModelAndStrategy> EveryModelAndStrategy() {
  std::vector<ModelAndStrategy> cases;
  for (const char* model : {"mlp", "gpt"}) {
    for (Strategy s : AllStrategies()) cases.emplace_back(model, s);
  }
  return cases;
}

inline std::string ModelAndStrategyName(const ::testing::TestParamInfo<ModelAndStrategy>& info) {
  std::string name = std::get<0>(info.param) + "_" + std::string(StrategyName(std::get<1>(info.param)));
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
}

}  // namespace headroom::testing

#endif  // HEADROOM_TESTS_EXECUTOR_PLAN_FOR_TEST_H_
