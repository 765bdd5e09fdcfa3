// Trace replay throughput and the reserved-to-live ratio of the caching
// policy on a synthesised transformer-like training trace
// (bench/transformer_trace.h), with and without expandable segments, on the
// simulated device.
//
// Counters: events/s, peak_reserved / peak_live (1.0 = no overhead), and the
// BM_Baseline_TraceWalk floor: the per-event bookkeeping (hash map of live
// pointers) any replay must pay.
#include "allocator/alloc_conf.h"
#include "replay/allocation_trace.h"
#include "replay/trace_replay.h"
#include "benchmark/benchmark.h"
#include "bench/transformer_trace.h"
#include "common/units.h"

namespace headroom {
namespace {

using bench::PeakLive;
using bench::TransformerTrace;

void BM_ReplayTransformer(benchmark::State& state) {
  const AllocationTrace trace = TransformerTrace(16);
  const char* conf = state.range(0) != 0 ? "expandable_segments:True" : "";
  const ReplayOptions options{.capacity_bytes = 80 * kGiB, .allocator = *ParseAllocConf(conf)};
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
BENCHMARK(BM_ReplayTransformer)->ArgName("expandable")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_Baseline_TraceWalk(benchmark::State& state) {
  const AllocationTrace trace = TransformerTrace(16);
  for (auto _ : state) benchmark::DoNotOptimize(PeakLive(trace));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * trace.events.size()));
}
BENCHMARK(BM_Baseline_TraceWalk)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace headroom
