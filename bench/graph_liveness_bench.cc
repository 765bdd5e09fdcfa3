// Profiling a training step: build the forward graph (models/builders.h),
// derive the step (graph/training_step.h) and run liveness
// (graph/liveness.h) for Llama-2-70B (80 layers) at sequence 8192, which
// `headroom estimate` does several times per run. Baseline in the same run:
// the naive liveness that scans every tensor at every op (O(ops * tensors)),
// against ProfileMemory on the same step.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "models/builders.h"
#include "graph/liveness.h"
#include "models/model_source.h"
#include "graph/training_step.h"
#include "planner/checkpoint_mode_plan.h"

namespace headroom {
namespace {

Graph Forward(const char* preset, int64_t seq_len) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig(preset);
  if (!config.ok()) std::abort();
  absl::StatusOr<Graph> forward = BuildModelGraph(
      *config, {.batch = 1, .seq_len = seq_len, .param_dtype = DType::kBF16,
                .compute_dtype = DType::kBF16, .attention = AttentionImpl::kFlash});
  if (!forward.ok()) std::abort();
  return *std::move(forward);
}

Graph Step(const Graph& forward, CheckpointMode mode) {
  absl::StatusOr<CheckpointPlan> plan = PlanForMode(forward, mode);
  if (!plan.ok()) std::abort();
  absl::StatusOr<Graph> step = BuildTrainingStep(forward, {.checkpoint = *std::move(plan)});
  if (!step.ok()) std::abort();
  return *std::move(step);
}

// The whole pipeline, per checkpoint mode (the range argument).
void BM_Llama70B_Seq8192_BuildStepProfile(benchmark::State& state) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("llama-2-70b");
  const auto mode = static_cast<CheckpointMode>(state.range(0));
  for (auto _ : state) {
    absl::StatusOr<Graph> forward = BuildModelGraph(
        *config, {.batch = 1, .seq_len = 8192, .param_dtype = DType::kBF16,
                  .compute_dtype = DType::kBF16, .attention = AttentionImpl::kFlash});
    absl::StatusOr<CheckpointPlan> plan = PlanForMode(*forward, mode);
    absl::StatusOr<Graph> step = BuildTrainingStep(*forward, {.checkpoint = *std::move(plan)});
    benchmark::DoNotOptimize(ProfileMemory(*step).peak_bytes);
  }
  state.SetLabel(std::string(CheckpointModeName(mode)));
}
BENCHMARK(BM_Llama70B_Seq8192_BuildStepProfile)
    ->Arg(static_cast<int>(CheckpointMode::kOff))
    ->Arg(static_cast<int>(CheckpointMode::kFull))
    ->Arg(static_cast<int>(CheckpointMode::kSelective))
    ->Unit(benchmark::kMillisecond);

void BM_Llama70B_Seq8192_ProfileOnly(benchmark::State& state) {
  const Graph step = Step(Forward("llama-2-70b", 8192), CheckpointMode::kFull);
  for (auto _ : state) benchmark::DoNotOptimize(ProfileMemory(step).peak_bytes);
  state.counters["ops"] = static_cast<double>(step.num_ops());
  state.counters["tensors"] = static_cast<double>(step.num_tensors());
}
BENCHMARK(BM_Llama70B_Seq8192_ProfileOnly)->Unit(benchmark::kMillisecond);

// Same step for both: Llama-2-7B (32 layers), sequence 4096, no checkpointing.
const Graph& SmallStep() {
  static const Graph step = Step(Forward("llama-2-7b", 4096), CheckpointMode::kOff);
  return step;
}

void BM_Llama7B_ProfileMemory(benchmark::State& state) {
  const Graph& step = SmallStep();
  for (auto _ : state) benchmark::DoNotOptimize(ProfileMemory(step).peak_bytes);
}
BENCHMARK(BM_Llama7B_ProfileMemory)->Unit(benchmark::kMillisecond);

void BM_Baseline_Llama7B_NaiveScan(benchmark::State& state) {
  const Graph& step = SmallStep();
  for (auto _ : state) {
    const std::vector<TensorLifetime> life = ComputeLifetimes(step);
    uint64_t peak = 0;
    for (OpId op = 0; op < static_cast<OpId>(step.num_ops()); ++op) {
      uint64_t live = 0;
      for (const Tensor& t : step.tensors()) {
        const TensorLifetime& l = life[static_cast<size_t>(t.id)];
        if (l.first <= op && op <= l.last) live += t.bytes();
      }
      peak = std::max(peak, live);
    }
    benchmark::DoNotOptimize(peak);
  }
}
BENCHMARK(BM_Baseline_Llama7B_NaiveScan)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace headroom
