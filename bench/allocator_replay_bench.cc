// Trace replay throughput and the reserved-to-live ratio of the caching
// policy on a synthesised transformer-like training trace
// (bench/transformer_trace.h) under pytorch-default, expandable and headroom, on the
// simulated device.
//
// Counters: events/s, peak_reserved / peak_live (1.0 = no overhead), and the
// BM_Baseline_TraceWalk floor: the per-event bookkeeping (hash map of live
// pointers) any replay must pay.
//
// BM_RealTrace/<trace>/<policy>: every recorded PyTorch run in bench/traces
// (whole CPU training runs from validation/record-trace: the model built,
// then six steps) under pytorch-default, expandable and headroom:
// reserved / live on an 80 GiB device, the smallest device that runs the
// trace without an out-of-memory error (over live; found by bisection at
// 2 MiB), and the device calls the allocator made (cudaMalloc or page
// creations, and their frees; pages mapped and unmapped), over the run, in
// the first two steps (warmup_maps) and per step after them, from the steps'
// boundaries the recorder wrote (NAME.steps.json); and the same over a
// longer loop of 42 steps (loop42_*: steps 3-6 played ten times over).
// HEADROOM_BENCH_CONFS='conf;conf;...' replaces the three policies (presets
// or HEADROOM_ALLOC_CONF strings), to compare variants of a policy.
// BM_RealTrace/<trace>/headroom-plan: the headroom preset following the plan
// of the run's repeating steps, made from its own recording (Note [Following
// a layout plan]; skipped where the run has no plan).
// BM_RealTrace/<trace>/planned: the yardstick, a layout of the whole run
// planned with every lifetime known (layout/trace_layout.h): the most 2 MiB
// pages its live blocks touch at once over live (smallest_over_live, as a
// policy's smallest device), its single buffer over live, and its time.
// .../planned-steps and .../planned-steps-by-lifetime: the plan a run could
// follow forever, its steps up to the first one every later step repeats
// (Note [Repeating steps]; skipped where there is none), visited by size or
// by size times lifetime.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "allocator/alloc_conf.h"
#include "layout/trace_layout.h"
#include "replay/allocation_trace.h"
#include "replay/recorded_run.h"
#include "replay/trace_replay.h"
#include "benchmark/benchmark.h"
#include "bench/transformer_trace.h"
#include "common/units.h"

namespace headroom {
namespace {

using bench::PeakLive;
using bench::TransformerTrace;

void BM_ReplayTransformer(benchmark::State& state, const char* preset) {
  const AllocationTrace trace = TransformerTrace(16);
  const ReplayOptions options{.capacity_bytes = 80 * kGiB,
                              .allocator = *ResolveAllocConf(preset)};
  ReplayResult result;
  for (auto _ : state) {
    result = *ReplayTrace(trace, options);
    benchmark::DoNotOptimize(result);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * trace.events.size()));
  state.counters["events"] = static_cast<double>(trace.events.size());
  state.counters["peak_live_GiB"] = static_cast<double>(result.peak_live_bytes) / static_cast<double>(kGiB);
  state.counters["peak_reserved_GiB"] = static_cast<double>(result.peak_reserved_bytes) / static_cast<double>(kGiB);
  state.counters["reserved_over_live"] = result.reserved_to_live;
  state.counters["ooms"] = static_cast<double>(result.ooms);
}
BENCHMARK_CAPTURE(BM_ReplayTransformer, pytorch_default, "pytorch-default")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayTransformer, expandable, "expandable")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayTransformer, headroom, "headroom")->Unit(benchmark::kMillisecond);

void BM_Baseline_TraceWalk(benchmark::State& state) {
  const AllocationTrace trace = TransformerTrace(16);
  for (auto _ : state) benchmark::DoNotOptimize(PeakLive(trace));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * trace.events.size()));
}
BENCHMARK(BM_Baseline_TraceWalk)->Unit(benchmark::kMillisecond);

// Steady steps: the steps after the first two (the model built, the optimizer state created, and a step whose
// layout still settles).
constexpr size_t kWarmUpSteps = 2;

// A counter's increase per steady step, from the statistics at each step's end (more than kWarmUpSteps).
double PerSteadyStep(const std::vector<MemoryStats>& steps, int64_t MemoryStats::*counter) {
  return static_cast<double>(steps.back().*counter - steps[kWarmUpSteps - 1].*counter) /
         static_cast<double>(steps.size() - kWarmUpSteps);
}

// `follow_plan`: the policy follows the plan of the run's repeating steps (Note [Following a layout plan]).
void BM_RealTrace(benchmark::State& state, const std::string& path, const std::string& conf, bool follow_plan) {
  const absl::StatusOr<RecordedRun> run = LoadRecordedRun(path);
  if (!run.ok()) {
    state.SkipWithError(std::string(run.status().message()).c_str());
    return;
  }
  // A conf from HEADROOM_BENCH_CONFS may be mistyped: its error, not a crash.
  absl::StatusOr<AllocatorOptions> allocator = ResolveAllocConf(conf);
  if (!allocator.ok()) {
    state.SkipWithError(("HEADROOM_BENCH_CONFS " + std::string(allocator.status().message())).c_str());
    return;
  }
  const AllocationTrace& trace = run->trace;
  if (follow_plan) {
    const absl::StatusOr<RepeatingStepsLayout> steps = LayoutRepeatingStepsEitherOrder(trace, run->step_end_times);
    if (!steps.ok()) {
      state.SkipWithError(std::string(steps.status().message()).c_str());
      return;
    }
    allocator->layout_plan = std::make_shared<const LayoutPlan>(ToLayoutPlan(*steps));
  }
  // The recorder's step boundaries, for the page moves of a steady step.
  ReplayOptions options{.capacity_bytes = 80 * kGiB, .allocator = *allocator, .step_end_times = run->step_end_times};
  ReplayResult result;
  for (auto _ : state) {
    absl::StatusOr<ReplayResult> replayed = ReplayTrace(trace, options);
    if (!replayed.ok()) {
      state.SkipWithError(std::string(replayed.status().message()).c_str());
      return;
    }
    result = *std::move(replayed);
    benchmark::DoNotOptimize(result);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * trace.events.size()));
  const absl::StatusOr<uint64_t> smallest_or = SmallestDevice(trace, options);
  if (!smallest_or.ok()) {
    state.SkipWithError(std::string(smallest_or.status().message()).c_str());
    return;
  }
  const uint64_t smallest = *smallest_or;
  state.counters["live_MiB"] = static_cast<double>(result.peak_live_bytes) / static_cast<double>(kMiB);
  state.counters["reserved_over_live"] = result.reserved_to_live;
  state.counters["smallest_over_live"] =
      static_cast<double>(smallest) / static_cast<double>(result.peak_live_bytes);
  state.counters["device_allocs"] = static_cast<double>(result.final_stats.num_device_alloc);
  state.counters["device_frees"] = static_cast<double>(result.final_stats.num_device_free);
  state.counters["pages_mapped"] = static_cast<double>(result.final_stats.num_pages_mapped);
  state.counters["pages_unmapped"] = static_cast<double>(result.final_stats.num_pages_unmapped);
  if (const std::vector<MemoryStats>& steps = result.step_stats; steps.size() > kWarmUpSteps) {
    state.counters["warmup_maps"] = static_cast<double>(steps[kWarmUpSteps - 1].num_pages_mapped);
    state.counters["steady_maps_per_step"] = PerSteadyStep(steps, &MemoryStats::num_pages_mapped);
    state.counters["steady_unmaps_per_step"] = PerSteadyStep(steps, &MemoryStats::num_pages_unmapped);
    state.counters["steady_device_allocs_per_step"] = PerSteadyStep(steps, &MemoryStats::num_device_alloc);
  }
  // A longer loop: steps 3 to 6 played ten times over (RepeatSteps), 42 steps. Reserved over live, and pages
  // mapped per step after the first two.
  if (const absl::StatusOr<RecordedRun> longer = RepeatSteps(*run, kWarmUpSteps, 10); longer.ok()) {
    options.step_end_times = longer->step_end_times;
    if (const absl::StatusOr<ReplayResult> long_result = ReplayTrace(longer->trace, options); long_result.ok()) {
      state.counters["loop42_reserved_over_live"] = long_result->reserved_to_live;
      state.counters["loop42_steady_maps_per_step"] =
          PerSteadyStep(long_result->step_stats, &MemoryStats::num_pages_mapped);
    } else {
      state.SkipWithError(std::string(long_result.status().message()).c_str());
    }
  }
  state.counters["anomalies"] = static_cast<double>(result.anomalies);
}

// What a planned layout is made of: the whole run, or its steps up to the one every later step repeats
// (Note [Repeating steps]), visited by size or by size times lifetime.
struct PlannedKind {
  bool repeating_steps;
  ArenaOrder order;
};

void BM_PlannedLayout(benchmark::State& state, const std::string& path, PlannedKind kind) {
  const absl::StatusOr<RecordedRun> run = LoadRecordedRun(path);
  if (!run.ok()) {
    state.SkipWithError(std::string(run.status().message()).c_str());
    return;
  }
  TraceLayout layout;
  size_t repeating_step = 0;
  // One layout or the other: the whole run, or its steps up to the repeating one.
  auto plan = [&]() -> absl::StatusOr<TraceLayout> {
    if (!kind.repeating_steps) return LayoutTrace(run->trace, kSmallestDeviceStep, kind.order);
    absl::StatusOr<RepeatingStepsLayout> steps =
        LayoutRepeatingSteps(run->trace, run->step_end_times, kSmallestDeviceStep, kind.order);
    if (!steps.ok()) return steps.status();
    repeating_step = steps->repeating_step;
    return std::move(steps->layout);
  };
  for (auto _ : state) {
    absl::StatusOr<TraceLayout> planned = plan();
    if (!planned.ok()) {
      state.SkipWithError(std::string(planned.status().message()).c_str());
      return;
    }
    layout = *std::move(planned);
    benchmark::DoNotOptimize(layout);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * run->trace.events.size()));
  // Over the trace's own live peak of requested bytes, as the policies' figures.
  const absl::StatusOr<ReplayResult> replayed = ReplayTrace(run->trace, {});
  if (!replayed.ok()) {
    state.SkipWithError(std::string(replayed.status().message()).c_str());
    return;
  }
  const auto live = static_cast<double>(replayed->peak_live_bytes);
  state.counters["live_MiB"] = live / static_cast<double>(kMiB);
  state.counters["smallest_over_live"] = static_cast<double>(layout.peak_page_bytes) / live;
  state.counters["arena_over_live"] = static_cast<double>(layout.arena.arena_bytes) / live;
  if (kind.repeating_steps) state.counters["repeating_step"] = static_cast<double>(repeating_step);
}

// One benchmark per trace and policy, registered before main runs.
const bool kRealTracesRegistered = [] {
  const std::vector<std::string> traces =
      RecordedRunTraces(HEADROOM_BENCH_TRACES_DIR).value_or(std::vector<std::string>{});
  for (const std::string& path : traces) {
    std::vector<std::string> policies = {"pytorch-default", "expandable", "headroom"};
    if (const char* extra = std::getenv("HEADROOM_BENCH_CONFS")) policies = absl::StrSplit(extra, ';');
    // "gpt2-fp32-adamw.6steps" for NAME.rmm.csv, "gpt2-fp32-adamw.cuda.6steps" for NAME.snapshot.json.
    const std::string name = std::filesystem::path(path).stem().stem().string();
    for (const std::string& policy : policies) {
      benchmark::RegisterBenchmark(("BM_RealTrace/" + name + "/" + policy).c_str(), BM_RealTrace, path, policy,
                                   false)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
    }
    benchmark::RegisterBenchmark(("BM_RealTrace/" + name + "/headroom-plan").c_str(), BM_RealTrace, path,
                                 std::string("headroom"), true)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
    for (const auto& [label, kind] : {std::pair<std::string, PlannedKind>{"planned", {false, ArenaOrder::kSize}},
                                      {"planned-steps", {true, ArenaOrder::kSize}},
                                      {"planned-steps-by-lifetime", {true, ArenaOrder::kSizeTimesLifetime}}}) {
      benchmark::RegisterBenchmark(("BM_RealTrace/" + name + "/" + label).c_str(), BM_PlannedLayout, path, kind)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
    }
  }
  return true;
}();

}  // namespace
}  // namespace headroom
