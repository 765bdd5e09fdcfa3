// Planning offload and hybrid (keep / recompute / offload) schedules
// (planner/offload.h) for a GPT-2 step (12 layers, eager attention, batch 8,
// sequence 1024) and a Llama-2-7B step (32 layers, flash attention, batch 1,
// sequence 4096), at budgets of 90, 80, 70 and 50% of the store-all peak.
// Op costs are the roofline model's on an H100 SXM (hardware/cost_model.h);
// copies run at the catalog's host link times host_link_efficiency, as
// OffloadSeconds prices them. Parameter gradients are left out of the budget,
// as when it comes from a GPU's memory (they are fixed state, not a planner's
// choice). Baseline in the same run: EvaluateSchedule of the store-all step,
// the one evaluation the planners' simulator stands in for.
//
// Counters: overhead_pct (step time over the store-all step's, in percent),
// host_bytes (pinned host memory at the plan's worst point), fits (1 when
// the planner met the budget, 0 when it said it cannot), replays and
// offloads (entries of each kind), ops (the step's). The baseline also gives
// the store-all step's time and, for reference, what checkpointing every
// layer costs and how low it brings the peak.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "graph/liveness.h"
#include "graph/training_step.h"
#include "hardware/cost_model.h"
#include "hardware/gpu_catalog.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/checkpoint_mode_plan.h"
#include "planner/offload.h"
#include "planner/plan.h"

namespace headroom {
namespace {

struct Workload {
  Graph step;
  PlanProblem problem;  // budget set per benchmark
  double store_all_seconds = 0;
  uint64_t store_all_peak = 0;
};

Workload Make(const char* preset, int64_t batch, int64_t seq_len, AttentionImpl attention) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig(preset);
  if (!config.ok()) std::abort();
  absl::StatusOr<Graph> forward =
      BuildModelGraph(*config, {.batch = batch, .seq_len = seq_len, .param_dtype = DType::kBF16,
                                .compute_dtype = DType::kBF16, .attention = attention});
  if (!forward.ok()) std::abort();
  absl::StatusOr<Graph> step = BuildTrainingStep(*forward, {});
  if (!step.ok()) std::abort();
  absl::StatusOr<const GpuSpec*> gpu = GpuCatalog::Builtin().Find("H100-SXM-80GB");
  if (!gpu.ok()) std::abort();
  Workload w{.step = *std::move(step)};
  const CostModelOptions cost_options;
  for (const Op& op : w.step.ops()) w.problem.op_cost.push_back(EstimateOpTime(op, **gpu, cost_options).seconds);
  w.problem.profile.count_parameter_gradients = false;
  w.problem.copy_bytes_per_cost = (*gpu)->host_link.bandwidth_bytes_per_s * cost_options.host_link_efficiency;
  for (double c : w.problem.op_cost) w.store_all_seconds += c;
  w.store_all_peak = ProfileMemory(w.step, w.problem.profile).peak_bytes;
  return w;
}

// Built once, on first use (the pointer inside problem is set per call: the
// workload does not move after construction).
Workload& Get(int model) {
  static Workload gpt2 = Make("gpt2", 8, 1024, AttentionImpl::kEager);
  static Workload llama = Make("llama-2-7b", 1, 4096, AttentionImpl::kFlash);
  Workload& w = model == 0 ? gpt2 : llama;
  w.problem.step = &w.step;
  return w;
}

const char* Name(int model) { return model == 0 ? "gpt2-12L" : "llama-2-7b"; }

using Planner = absl::StatusOr<Schedule> (*)(const PlanProblem&);

void Run(benchmark::State& state, Planner plan) {
  Workload& w = Get(static_cast<int>(state.range(0)));
  const auto percent = static_cast<double>(state.range(1));
  PlanProblem problem = w.problem;
  problem.budget = static_cast<uint64_t>(percent / 100 * static_cast<double>(w.store_all_peak));
  absl::StatusOr<Schedule> s;
  for (auto _ : state) {
    s = plan(problem);
    benchmark::DoNotOptimize(s);
  }
  state.SetLabel(absl::StrFormat("%s @%g%%", Name(static_cast<int>(state.range(0))), percent));
  state.counters["fits"] = s.ok() ? 1 : 0;
  state.counters["ops"] = static_cast<double>(w.step.num_ops());
  if (!s.ok()) return;
  absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, *s);
  if (!e.ok()) std::abort();
  state.counters["overhead_pct"] = (e->step_cost / w.store_all_seconds - 1) * 100;
  state.counters["host_bytes"] = static_cast<double>(e->host_peak_bytes);
  state.counters["replays"] = static_cast<double>(s->CountOf(ScheduleAction::kRecompute));
  state.counters["offloads"] = static_cast<double>(s->CountOf(ScheduleAction::kOffload));
}

void BM_PlanOffload(benchmark::State& state) { Run(state, &PlanOffload); }
void BM_PlanHybrid(benchmark::State& state) { Run(state, &PlanHybrid); }

void Budgets(benchmark::internal::Benchmark* b) {
  for (int model : {0, 1}) {
    for (int percent : {90, 80, 70, 50}) b->Args({model, percent});
  }
  b->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_PlanOffload)->Apply(Budgets);
BENCHMARK(BM_PlanHybrid)->Apply(Budgets);

void BM_Baseline_EvaluateStoreAll(benchmark::State& state) {
  Workload& w = Get(static_cast<int>(state.range(0)));
  const Schedule s = StoreAllSchedule(w.step);
  PlanProblem problem = w.problem;
  problem.budget = w.store_all_peak;
  for (auto _ : state) benchmark::DoNotOptimize(EvaluateSchedule(problem, s));
  state.SetLabel(Name(static_cast<int>(state.range(0))));
  state.counters["ops"] = static_cast<double>(w.step.num_ops());
  state.counters["store_all_ms"] = w.store_all_seconds * 1e3;
  absl::StatusOr<CheckpointPlan> plan = PlanForMode(w.step, CheckpointMode::kFull);
  if (!plan.ok()) std::abort();
  absl::StatusOr<Schedule> per_layer = SegmentSchedule(w.step, *plan);
  if (!per_layer.ok()) std::abort();
  absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, *per_layer);
  if (!e.ok()) std::abort();
  state.counters["per_layer_overhead_pct"] = (e->step_cost / w.store_all_seconds - 1) * 100;
  state.counters["per_layer_peak_pct"] =
      100 * static_cast<double>(e->peak_bytes) / static_cast<double>(w.store_all_peak);
}
BENCHMARK(BM_Baseline_EvaluateStoreAll)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace headroom
