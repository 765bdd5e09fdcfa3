// Plans over a 4-layer GPT-2 step for the layer classification and emit
// tests: the named checkpoint modes as segment schedules (as in
// tests/planner/schedule_test.cc), checkpoints of chosen layers, and hybrid
// plans with offloads (planner/offload.h).
#ifndef HEADROOM_TESTS_REPORT_STACK_PLANS_H_
#define HEADROOM_TESTS_REPORT_STACK_PLANS_H_

#include <algorithm>
#include <set>
#include <vector>

#include "graph/liveness.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/checkpoint_mode_plan.h"
#include "planner/offload.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "report/layer_plan.h"

namespace headroom::testing {

inline Graph BuildForward(const char* preset, AttentionImpl attention = AttentionImpl::kEager) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  config->num_layers = 4;
  absl::StatusOr<Graph> forward =
      BuildModelGraph(*config, {.batch = 1, .seq_len = 512, .param_dtype = DType::kBF16,
                                .compute_dtype = DType::kBF16, .attention = attention});
  EXPECT_TRUE(forward.ok()) << forward.status();
  return *std::move(forward);
}

inline const Graph& Gpt2Forward() {
  static const Graph forward = BuildForward("gpt2");
  return forward;
}

inline const Graph& Gpt2Step() {
  static const Graph step = *BuildTrainingStep(Gpt2Forward(), {});
  return step;
}

// The schedule of `plan`, a plan over the forward graph, on the step.
inline Schedule OnStep(CheckpointPlan plan) {
  const Graph& step = Gpt2Step();
  if (!plan.segment_of_op.empty()) plan.segment_of_op.resize(step.num_ops(), kNone);
  absl::StatusOr<Schedule> s = SegmentSchedule(step, plan);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Schedule{};
}

inline Schedule ModeSchedule(CheckpointMode mode, int every = 1) {
  absl::StatusOr<CheckpointPlan> plan = PlanForMode(Gpt2Forward(), mode, every);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return OnStep(plan.ok() ? *std::move(plan) : CheckpointPlan{});
}

// Each of `layers` checkpointed on its own; the others keep everything.
inline Schedule LayersSchedule(const std::set<int>& layers) {
  const Graph& forward = Gpt2Forward();
  CheckpointPlan plan;
  plan.segment_of_op.assign(forward.num_ops(), kNone);
  int segment = -1, last_layer = -1;
  for (const Op& op : forward.ops()) {
    if (op.phase != Phase::kForward || !layers.contains(op.layer)) continue;
    if (op.layer != last_layer) ++segment;
    last_layer = op.layer;
    plan.segment_of_op[static_cast<size_t>(op.id)] = segment;
  }
  return OnStep(std::move(plan));
}

// Every op costs 1; copies take `copy_ops` ops' time for a hidden state.
inline PlanProblem Gpt2Problem(double budget_fraction, double copy_ops) {
  const Graph& step = Gpt2Step();
  PlanProblem problem{.step = &step, .op_cost = std::vector<double>(step.num_ops(), 1.0), .budget = 1};
  problem.budget = static_cast<uint64_t>(budget_fraction * static_cast<double>(ProfileMemory(step).peak_bytes));
  const Tensor* hidden = nullptr;
  for (const Tensor& t : step.tensors()) {
    if (t.name.find("h.0.attn_residual") != std::string::npos) hidden = &t;
  }
  EXPECT_NE(hidden, nullptr);
  problem.copy_bytes_per_cost = hidden == nullptr ? 1 : static_cast<double>(hidden->bytes()) / copy_ops;
  return problem;
}

// A hybrid plan on a fast link: it offloads.
inline Schedule HybridSchedule(double budget_fraction = 0.7) {
  absl::StatusOr<Schedule> s = PlanHybrid(Gpt2Problem(budget_fraction, /*copy_ops=*/1e-3));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Schedule{};
}

inline StackPlan Classified(const Schedule& schedule, const Graph& step = Gpt2Step()) {
  absl::StatusOr<StackPlan> plan = ClassifyStack(step, schedule);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  EXPECT_TRUE(plan->Validate().ok()) << plan->Validate();
  return *std::move(plan);
}

}  // namespace headroom::testing

#endif  // HEADROOM_TESTS_REPORT_STACK_PLANS_H_
