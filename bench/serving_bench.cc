// `headroom estimate --engine vllm|sglang` for every bundled preset, the way
// the CLI runs it (the estimate and the fix search, each fix a full
// estimate), on an H100 and on an L4 where most presets do not start and
// every fix is tried. Issue [14]'s target: under one second each. Baseline in
// the same run: building the preset's graph at 8 tokens, which every serving
// estimate does once for the parameters. Presets the engines do not serve
// (encoders, CNNs) end in a one-line refusal and are skipped.
#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "hardware/gpu_catalog.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "serving/serving_estimate.h"

namespace headroom {
namespace {

void BM_ServingEveryPreset(benchmark::State& state) {
  const std::string name = PresetNames().at(static_cast<size_t>(state.range(0)));
  const ServingOptions options{.engine = state.range(1) == 0 ? kCurrentVllm : kCurrentSglang};
  const ServingMachine machine{.gpu = *GpuCatalog::Builtin().Find(state.range(2) == 0 ? "h100" : "l4")};
  state.SetLabel(absl::StrCat(name, state.range(1) == 0 ? " vllm" : " sglang", state.range(2) == 0 ? " h100" : " l4"));
  absl::StatusOr<LoadedModel> model = LoadModel(name);
  if (!model.ok() || !EstimateServing(*model, options, machine).ok()) {
    state.SkipWithError("not served");
    return;
  }
  for (auto _ : state) {
    absl::StatusOr<ServingEstimate> e = EstimateServing(*model, options, machine);
    std::vector<ServingFix> fixes = ServingFixes(*model, options, machine, *e);
    benchmark::DoNotOptimize(fixes);
  }
}
BENCHMARK(BM_ServingEveryPreset)
    ->ArgsProduct({benchmark::CreateDenseRange(0, static_cast<int64_t>(PresetNames().size()) - 1, 1), {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

void BM_Baseline_PresetParameterGraph(benchmark::State& state) {
  const std::string name = PresetNames().at(static_cast<size_t>(state.range(0)));
  state.SetLabel(name);
  absl::StatusOr<LoadedModel> model = LoadModel(name);
  if (!model.ok() || !model->config) {
    state.SkipWithError("no config");
    return;
  }
  for (auto _ : state) {
    absl::StatusOr<Graph> g = BuildModelGraph(*model->config, {.batch = 1, .seq_len = 8, .training = false});
    benchmark::DoNotOptimize(g);
  }
}
BENCHMARK(BM_Baseline_PresetParameterGraph)
    ->DenseRange(0, static_cast<int64_t>(PresetNames().size()) - 1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace headroom
