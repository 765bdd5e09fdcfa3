// GPU catalog lookups, which every `headroom estimate` does once per run.
// Baseline in the same run: a linear scan comparing normalized names.
#include <benchmark/benchmark.h>

#include "hardware/gpu_catalog.h"

namespace headroom {
namespace {

void BM_CatalogFind(benchmark::State& state) {
  const GpuCatalog& catalog = GpuCatalog::Builtin();
  for (auto _ : state) benchmark::DoNotOptimize(catalog.Find("NVIDIA H100 SXM5"));
}
BENCHMARK(BM_CatalogFind);

void BM_Baseline_LinearScan(benchmark::State& state) {
  const GpuCatalog& catalog = GpuCatalog::Builtin();
  for (auto _ : state) {
    const std::string query = NormalizeGpuName("NVIDIA H100 SXM5");
    const GpuSpec* found = nullptr;
    for (const GpuSpec& gpu : catalog.gpus()) {
      for (const std::string& alias : gpu.aliases) {
        if (NormalizeGpuName(alias) == query) found = &gpu;
      }
    }
    benchmark::DoNotOptimize(found);
  }
}
BENCHMARK(BM_Baseline_LinearScan);

}  // namespace
}  // namespace headroom
