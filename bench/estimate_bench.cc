// End-to-end `headroom estimate` work for Llama-2-70B (80 layers) at
// sequence 8192: load the preset, build the forward graph, derive the
// training step, profile liveness, add model states, and replay the step's
// allocation sequence through the caching allocator for reserved bytes
// (estimators/step_replay.h). The target is under one second.
// The replay stage alone is measured too (building the sequence, then
// replaying it with PyTorch's default policy and with expandable
// segments). Baseline in the same run: building the forward graph alone,
// the floor any graph-based estimate pays. Then every bundled preset, the
// way the CLI estimates it by default.
#include <benchmark/benchmark.h>

#include "allocator/simulated/simulated_backend.h"
#include "estimators/estimate_stages.h"
#include "estimators/fit_search.h"
#include "estimators/memory_estimate.h"
#include "estimators/step_replay.h"
#include "hardware/gpu_catalog.h"
#include "models/builders.h"
#include "models/model_source.h"

namespace headroom {
namespace {

JobSpec Llama70bJob() {
  return {.micro_batch = 1, .seq_len = 8192, .precision = Precision::kBf16Mixed,
          .optimizer = Optimizer::kAdamW, .attention = AttentionImpl::kFlash};
}

const GpuSpec* H100() { return *GpuCatalog::Builtin().Find("H100-80GB"); }

void BM_EstimateLlama2_70B_Seq8192(benchmark::State& state) {
  for (auto _ : state) {
    absl::StatusOr<LoadedModel> model = LoadModel("llama-2-70b");
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(*model, Llama70bJob(), {.gpu = H100()});
    if (!e.ok()) state.SkipWithError(std::string(e.status().message()).c_str());
    benchmark::DoNotOptimize(e);
  }
}
BENCHMARK(BM_EstimateLlama2_70B_Seq8192)->Unit(benchmark::kMillisecond);

// What the CLI does by default when the job does not fit: the estimate, the
// micro-batch and sequence searches, and every candidate fix.
void BM_EstimateWithSearchAndFixes(benchmark::State& state) {
  for (auto _ : state) {
    absl::StatusOr<LoadedModel> model = LoadModel("llama-2-70b");
    const JobSpec job = Llama70bJob();
    const Machine machine{.gpu = H100()};
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(*model, job, machine);
    absl::StatusOr<FitLimits> limits = FindLimits(*model, job, machine);
    absl::StatusOr<std::vector<Fix>> fixes = RankFixes(*model, job, machine, *e);
    if (!fixes.ok()) state.SkipWithError(std::string(fixes.status().message()).c_str());
    benchmark::DoNotOptimize(limits);
    benchmark::DoNotOptimize(fixes);
  }
}
BENCHMARK(BM_EstimateWithSearchAndFixes)->Unit(benchmark::kMillisecond);

// The allocator replay stage of that estimate on its own: the sequence
// (resident state, the step in liveness order, the optimizer's
// temporaries) and its replay; state.range(0) = 1 for expandable segments.
void BM_AllocatorReplayStage_Llama2_70B_Seq8192(benchmark::State& state) {
  absl::StatusOr<LoadedModel> model = LoadModel("llama-2-70b");
  const JobSpec job = Llama70bJob();
  const EstimateSetup setup = ResolveSetup(*model, job);
  absl::StatusOr<Graph> forward = BuildForwardGraph(*model, job, setup);
  absl::StatusOr<Graph> step = BuildStep(*forward, job, setup);
  absl::StatusOr<ModelStates> states = StageModelStates(*forward, job, setup, 0);
  if (!states.ok()) {
    state.SkipWithError(std::string(states.status().message()).c_str());
    return;
  }
  const std::vector<ResidentBlock> resident =
      ResidentBlocks(*forward, *states, job, setup, {.cublas_workspace = H100()->cublas_workspace_bytes});
  const OptimizerTemporaries temporaries = OptimizerStepTemporaries(*forward, job, setup);
  const AllocatorOptions allocator{.expandable_segments = state.range(0) == 1};
  size_t events = 0;
  for (auto _ : state) {
    absl::StatusOr<StepAllocations> sequence =
        BuildStepAllocations(*step, resident, {.profile = {.count_parameter_gradients = !setup.persistent_gradients},
                                               .autocast = setup.autocast,
                                               .optimizer_temporaries = temporaries});
    absl::StatusOr<AllocatorReplay> replay = ReplayAllocations(*sequence, allocator, kMaxSimulatedCapacity);
    if (!replay.ok()) state.SkipWithError(std::string(replay.status().message()).c_str());
    events = sequence->trace.events.size();
    benchmark::DoNotOptimize(replay);
  }
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK(BM_AllocatorReplayStage_Llama2_70B_Seq8192)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Issue [13]'s target: every bundled preset answers `headroom estimate --gpu H100-80GB` (the estimate, the limit
// searches and, when it does not fit, every candidate fix) in under one second. state.range(0) indexes
// PresetNames(); the baseline beside it builds that preset's forward graph once.
JobSpec PresetJob(const LoadedModel& model) {
  // The CLI's defaults (cli/job_flags.cc, ApplyModelDefaults).
  const bool flash = !model.config || HasFlashAttentionPath(*model.config);
  return {.micro_batch = 1, .precision = Precision::kBf16Mixed, .optimizer = Optimizer::kAdamW,
          .attention = flash ? AttentionImpl::kFlash : AttentionImpl::kEager};
}

// range(1): on an H100, or on a budget of 100 TiB, where every limit search runs to its cap (1024 samples, the
// model's longest context) and the graphs probed are the largest.
void BM_EveryPresetEstimateWithSearchAndFixes(benchmark::State& state) {
  const std::string name = PresetNames().at(static_cast<size_t>(state.range(0)));
  const bool huge_budget = state.range(1) != 0;
  state.SetLabel(name + (huge_budget ? " 100TiB" : " h100"));
  for (auto _ : state) {
    absl::StatusOr<LoadedModel> model = LoadModel(name);
    if (!model.ok()) {
      state.SkipWithError(std::string(model.status().message()).c_str());
      return;
    }
    const Machine machine = huge_budget ? Machine{.budget = uint64_t{100} << 40} : Machine{.gpu = H100()};
    const JobSpec job = PresetJob(*model);
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(*model, job, machine);
    if (!e.ok()) {
      state.SkipWithError(std::string(e.status().message()).c_str());
      return;
    }
    absl::StatusOr<FitLimits> limits = FindLimits(*model, job, machine);
    absl::StatusOr<std::vector<Fix>> fixes =
        e->fits() ? std::vector<Fix>{} : RankFixes(*model, job, machine, *e);
    if (!limits.ok()) state.SkipWithError(std::string(limits.status().message()).c_str());
    if (!fixes.ok()) state.SkipWithError(std::string(fixes.status().message()).c_str());
    benchmark::DoNotOptimize(fixes);
  }
}
BENCHMARK(BM_EveryPresetEstimateWithSearchAndFixes)
    ->ArgsProduct({benchmark::CreateDenseRange(0, static_cast<int64_t>(PresetNames().size()) - 1, 1), {0, 1}})
    ->Unit(benchmark::kMillisecond);

void BM_Baseline_EveryPresetForwardGraph(benchmark::State& state) {
  const std::string name = PresetNames().at(static_cast<size_t>(state.range(0)));
  state.SetLabel(name);
  absl::StatusOr<LoadedModel> model = LoadModel(name);
  if (!model.ok()) {
    state.SkipWithError(std::string(model.status().message()).c_str());
    return;
  }
  const JobSpec job = PresetJob(*model);
  const EstimateSetup setup = ResolveSetup(*model, job);
  for (auto _ : state) {
    absl::StatusOr<Graph> g = BuildForwardGraph(*model, job, setup);
    benchmark::DoNotOptimize(g);
  }
}
BENCHMARK(BM_Baseline_EveryPresetForwardGraph)
    ->DenseRange(0, static_cast<int64_t>(PresetNames().size()) - 1)
    ->Unit(benchmark::kMillisecond);

void BM_Baseline_BuildForwardOnly(benchmark::State& state) {
  absl::StatusOr<LoadedModel> model = LoadModel("llama-2-70b");
  for (auto _ : state) {
    absl::StatusOr<Graph> g = BuildModelGraph(*model->config, {.batch = 1, .seq_len = 8192,
                                                               .param_dtype = DType::kF32,
                                                               .compute_dtype = DType::kBF16,
                                                               .attention = AttentionImpl::kFlash});
    benchmark::DoNotOptimize(g);
  }
}
BENCHMARK(BM_Baseline_BuildForwardOnly)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace headroom
