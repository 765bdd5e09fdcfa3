// The executor on a GPU (needs a driver to start; reports an error per
// benchmark without a visible device).
//
//   BM_GpuStep/strategy:S    one training step of a GPT-style model (8 layers,
//                            hidden 512, 8 heads, batch 8 x 256 tokens) under
//                            strategy S's plan for 60% of the store-all peak;
//                            S = store-all is the baseline. Counters: the
//                            planner's predicted overhead, the reserved peak
//                            and the replay's prediction of it, and whether
//                            the allocator's peaks equal the prediction.
//   BM_PinnedPool            the host pool over one cudaHostAlloc region, on
//                            an offload plan's host-copy pattern (48 copies of
//                            256 KiB..16 MiB, freed in reverse), against
//   BM_Baseline_CudaHostAllocPerTensor   one cudaHostAlloc/cudaFreeHost per copy.
#include <cuda_runtime.h>

#include <vector>

#include "allocator/cuda/cuda_device.h"
#include "bench/host_copy_sizes.h"
#include "benchmark/benchmark.h"
#include "executor/cuda/cuda_compute_device.h"
#include "executor/executor.h"
#include "planner/planner.h"

namespace headroom {
namespace {

bool NoGpu(benchmark::State& state) {
  if (cuda::CudaDeviceCount() > 0) return false;
  state.SkipWithError("no CUDA device visible");
  return true;
}

void BM_GpuStep(benchmark::State& state) {
  if (NoGpu(state)) return;
  const auto strategy = static_cast<Strategy>(state.range(0));
  const DemoModel model =
      *BuildDemoGpt({.batch = 8, .seq = 256, .vocab = 1024, .hidden = 512, .heads = 8, .layers = 8});
  const PlanInput in = *DemoPlanInput(model, DemoJob(), uint64_t{80} << 30);
  const PlanEvaluation store_all = *EvaluateSchedule(in.Problem(uint64_t{1} << 50), StoreAllSchedule(in.step));
  const absl::StatusOr<PlanResult> plan =
      RunStrategy(in.Problem(static_cast<uint64_t>(0.6 * static_cast<double>(store_all.peak_bytes))), strategy);
  if (!plan.ok()) {
    state.SkipWithError(std::string(plan.status().message()).c_str());
    return;
  }
  auto executor = *PlanExecutor::Create(model, in, plan->schedule, {}, *CudaComputeDevice::Create(0));
  // Warm-up: the steps in which the allocator's cache grows (Note [The first step in the replay]).
  StepResult settled;
  int64_t step = 0;
  for (; step < kStepsUntilSettled; ++step) {
    const absl::StatusOr<StepResult> r = executor->RunStep(model.MakeBatch(step));
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    settled = *r;
  }
  for (auto _ : state) {
    const absl::StatusOr<StepResult> r = executor->RunStep(model.MakeBatch(step++));
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
  }
  const Graph scheduled = *MaterializeSchedule(in.step, plan->schedule);
  const PlanReplay predicted = *ReplayPlan(in, scheduled);
  state.SetLabel(std::string(StrategyName(strategy)));
  state.counters["predicted_overhead_pct"] = (plan->evaluation.step_cost / store_all.step_cost - 1) * 100;
  state.counters["planned_peak_MiB"] = static_cast<double>(plan->evaluation.peak_bytes) / (1 << 20);
  state.counters["reserved_MiB"] = static_cast<double>(settled.peak_reserved_bytes) / (1 << 20);
  state.counters["predicted_reserved_MiB"] = static_cast<double>(predicted.allocator.peak_reserved_bytes) / (1 << 20);
  state.counters["allocated_equal"] = settled.peak_allocated_bytes == predicted.allocator.peak_allocated_bytes;
  state.counters["reserved_equal"] = settled.peak_reserved_bytes == predicted.allocator.peak_reserved_bytes;
}
BENCHMARK(BM_GpuStep)
    ->ArgName("strategy")
    ->DenseRange(0, static_cast<int>(Strategy::kHybrid))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_PinnedPool(benchmark::State& state) {
  if (NoGpu(state)) return;
  auto device = *CudaComputeDevice::Create(0);
  auto pool = *HostPool::Create(uint64_t{512} << 20, device->HostMemory());
  const std::vector<uint64_t> sizes = HostCopySizes();
  std::vector<void*> held;
  for (auto _ : state) {
    held.clear();
    for (uint64_t s : sizes) held.push_back(*pool->Allocate(s));
    for (size_t i = held.size(); i-- > 0;) (void)pool->Free(held[i]);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * sizes.size()));
}
BENCHMARK(BM_PinnedPool)->Unit(benchmark::kMicrosecond);

void BM_Baseline_CudaHostAllocPerTensor(benchmark::State& state) {
  if (NoGpu(state)) return;
  const std::vector<uint64_t> sizes = HostCopySizes();
  std::vector<void*> held;
  for (auto _ : state) {
    held.clear();
    for (uint64_t s : sizes) {
      void* p = nullptr;
      if (cudaHostAlloc(&p, s, cudaHostAllocDefault) != cudaSuccess) {
        state.SkipWithError("cudaHostAlloc failed");
        return;
      }
      held.push_back(p);
    }
    for (size_t i = held.size(); i-- > 0;) cudaFreeHost(held[i]);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * sizes.size()));
}
BENCHMARK(BM_Baseline_CudaHostAllocPerTensor)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace headroom
