// Steps that planner and report tests share: GPT-2 small under a named
// checkpoint mode, and a small schedule with an offload as
// MaterializeSchedule writes it (planner/schedule.h).
#ifndef HEADROOM_TESTS_PLANNER_STEP_FIXTURES_H_
#define HEADROOM_TESTS_PLANNER_STEP_FIXTURES_H_

#include <string>
#include <utility>

#include "graph/graph.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/checkpoint_mode_plan.h"

namespace headroom::testing {

// GPT-2 small, batch 2, sequence 512, bf16, eager attention.
inline Graph Gpt2Step(CheckpointMode mode) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("gpt2");
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> forward = BuildModelGraph(
      *config, {.batch = 2, .seq_len = 512, .param_dtype = DType::kBF16, .compute_dtype = DType::kBF16,
                .attention = AttentionImpl::kEager, .training = true,
                // The step these tests' figures were taken on: GPT-2's own loss, before ForCausalLMLoss.
                .runtime = {.transformers = {.major = 4, .minor = 46}}});
  EXPECT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<CheckpointPlan> plan = PlanForMode(*forward, mode);
  EXPECT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<Graph> step = BuildTrainingStep(*forward, {.checkpoint = *std::move(plan)});
  EXPECT_TRUE(step.ok()) << step.status();
  return *std::move(step);
}

// `a` is offloaded after its last forward reader and prefetched back as a
// fresh tensor for the backward op.
inline Graph OffloadGraph(std::string name = "offload") {
  Graph g(std::move(name));
  auto f32 = [&g](std::string tensor, int64_t n, TensorRole role = TensorRole::kActivation) {
    return g.AddTensor({.name = std::move(tensor), .shape = {n}, .dtype = DType::kF32, .role = role});
  };
  const TensorId x = f32("x", 256, TensorRole::kInput);
  const TensorId a = f32("a", 1024);
  const TensorId b = f32("b", 2048);
  const TensorId c = f32("c", 512);
  const TensorId a2 = f32("a@prefetch0", 1024);
  const TensorId grad = f32("grad", 256, TensorRole::kGradient);
  g.AddOp({.kind = "linear", .name = "fc1", .inputs = {x}, .outputs = {a}});
  g.AddOp({.kind = "linear", .name = "fc2", .inputs = {a}, .outputs = {b}});
  g.AddOp({.kind = "offload_copy", .name = "offload a", .inputs = {a}, .phase = Phase::kBackward});
  g.AddOp({.kind = "linear", .name = "fc3", .inputs = {b}, .outputs = {c}, .phase = Phase::kLoss});
  g.AddOp({.kind = "prefetch_copy", .name = "prefetch a", .outputs = {a2}, .phase = Phase::kBackward});
  g.AddOp({.kind = "linear_backward", .name = "fc1.backward", .inputs = {a2, c}, .outputs = {grad},
           .phase = Phase::kBackward});
  return g;
}

}  // namespace headroom::testing

#endif  // HEADROOM_TESTS_PLANNER_STEP_FIXTURES_H_
