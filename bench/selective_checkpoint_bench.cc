// Plans as PyTorch runs them (planner/selective_checkpoint.h): the time to
// turn a strategy's schedule into selective checkpointing of the model's
// blocks and evaluate it, and what that costs the plan, on the problems
// `headroom plan` builds for the gpt2 preset (default job: batch 1, sequence
// 1024, bf16-mixed, AdamW, eager attention so that selective plans exist)
// and for it with 156 layers (about 10,000 ops), at 70% of store-all.
//
//   build/bench/selective_checkpoint_bench --benchmark_min_time=0.05
//
// Counters of realize/<input>/<strategy> (the strategy's plan made once,
// untimed; the time is RealizeSelectiveCheckpoint and EvaluateSchedule of
// what it returns):
//   planned_overhead_pct, planned_peak_pct   the strategy's own plan
//   realized_overhead_pct, realized_peak_pct what PyTorch runs of it
//   blocks                                   checkpointed blocks
// and of torch_ops/<input>/<strategy>: RunStrategy under
// PlanRunner::kTorchSelectiveCheckpoint (planning again for a lower budget
// while what runs does not fit), with `fits` and the same realized counters.
// Baseline of the same run, BM_Baseline_EvaluateStoreAll/<input>: one
// evaluation of the store-all schedule.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "estimators/plan_input.h"
#include "hardware/gpu_catalog.h"
#include "models/model_source.h"
#include "planner/plan.h"
#include "planner/planner.h"
#include "planner/selective_checkpoint.h"

namespace headroom {
namespace {

constexpr double kBudgetShare = 0.7;

struct Input {
  PlanInput in;
  PlanEvaluation store_all;
};

const Input& InputFor(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Input>> cache;
  std::unique_ptr<Input>& input = cache[name];
  if (input) return *input;
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("gpt2");
  absl::StatusOr<const GpuSpec*> gpu = GpuCatalog::Builtin().Find("H100-SXM-80GB");
  if (!config.ok() || !gpu.ok()) std::abort();
  if (name == "gpt2-10k") config->num_layers = 156;  // bench/plan_strategies_bench.cc's step of ~10,000 ops
  const LoadedModel model{.name = "gpt2", .kind = ModelSourceKind::kPreset, .config = *config};
  absl::StatusOr<PlanInput> in =
      BuildPlanInput(model, JobSpec{.attention = AttentionImpl::kEager}, Machine{.gpu = *gpu});
  if (!in.ok()) std::abort();
  input = std::make_unique<Input>(Input{.in = *std::move(in)});
  input->store_all = *EvaluateSchedule(input->in.Problem(std::numeric_limits<uint64_t>::max()),
                                       StoreAllSchedule(input->in.step));
  return *input;
}

PlanProblem ProblemFor(const Input& input, PlanRunner runner) {
  const double budget = kBudgetShare * static_cast<double>(input.store_all.peak_bytes);
  PlanProblem p = input.in.Problem(static_cast<uint64_t>(budget));
  p.runner = runner;
  return p;
}

void SetFigures(benchmark::State& state, const std::string& prefix, const Input& input, const PlanEvaluation& e) {
  state.counters[prefix + "_overhead_pct"] = 100 * (e.step_cost - e.base_cost) / e.base_cost;
  state.counters[prefix + "_peak_pct"] =
      100 * static_cast<double>(e.peak_bytes) / static_cast<double>(input.store_all.peak_bytes);
}

void BM_Baseline_EvaluateStoreAll(benchmark::State& state, const std::string& name) {
  const Input& input = InputFor(name);
  const PlanProblem problem = input.in.Problem(std::numeric_limits<uint64_t>::max());
  const Schedule schedule = StoreAllSchedule(input.in.step);
  for (auto _ : state) benchmark::DoNotOptimize(EvaluateSchedule(problem, schedule));
  state.counters["ops"] = static_cast<double>(input.in.step.num_ops());
}

void BM_Realize(benchmark::State& state, const std::string& name, Strategy strategy) {
  const Input& input = InputFor(name);
  const PlanProblem problem = ProblemFor(input, PlanRunner::kAnySchedule);
  absl::StatusOr<PlanResult> plan = RunStrategy(problem, strategy);
  if (!plan.ok()) {
    state.SkipWithError(std::string(plan.status().message()).c_str());
    return;
  }
  absl::StatusOr<PlanEvaluation> realized;
  size_t blocks = 0;
  for (auto _ : state) {
    absl::StatusOr<SelectiveCheckpoint> sc = RealizeSelectiveCheckpoint(input.in.step, plan->schedule);
    if (!sc.ok()) std::abort();
    realized = EvaluateSchedule(problem, sc->schedule);
    blocks = sc->regions.size();
  }
  SetFigures(state, "planned", input, plan->evaluation);
  SetFigures(state, "realized", input, *realized);
  state.counters["blocks"] = static_cast<double>(blocks);
}

void BM_TorchOps(benchmark::State& state, const std::string& name, Strategy strategy) {
  const Input& input = InputFor(name);
  const PlanProblem problem = ProblemFor(input, PlanRunner::kTorchSelectiveCheckpoint);
  absl::StatusOr<PlanResult> r;
  for (auto _ : state) r = RunStrategy(problem, strategy);
  if (!r.ok()) {
    state.SetLabel(std::string(r.status().message()).substr(0, 80));
    state.counters["fits"] = 0;
    return;
  }
  state.counters["fits"] = r->fits ? 1 : 0;
  SetFigures(state, "realized", input, r->evaluation);
  state.counters["blocks"] = static_cast<double>(r->regions.size());
}

const bool kRegistered = [] {
  for (const std::string name : {"gpt2", "gpt2-10k"}) {
    benchmark::RegisterBenchmark(("BM_Baseline_EvaluateStoreAll/" + name).c_str(), BM_Baseline_EvaluateStoreAll,
                                 name);
    for (Strategy s : {Strategy::kSqrtN, Strategy::kChenGreedy, Strategy::kChainDp, Strategy::kHybrid}) {
      const std::string strategy(StrategyName(s));
      benchmark::RegisterBenchmark(("realize/" + name + "/" + strategy).c_str(), BM_Realize, name, s)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("torch_ops/" + name + "/" + strategy).c_str(), BM_TorchOps, name, s)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
    }
  }
  return true;
}();

}  // namespace
}  // namespace headroom
