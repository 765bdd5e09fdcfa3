// Trace replay throughput and the reserved-to-live ratio of the caching
// policy on synthesised transformer-like training traces, with and without
// expandable segments.
//
// The trace: persistent weights (and, from the first backward, gradients) of
// a 24-layer model with hidden size 4096; each step runs forward (saved
// activations per layer, attention scores freed after use) and backward
// (gradient temporaries; saved activations freed in reverse), with the
// sequence length changing from step to step as with dynamic batches, which
// is what fragments a caching allocator.
//
// Counters: events/s, peak_reserved / peak_live (1.0 = no overhead), and the
// BM_Baseline_TraceWalk floor: the per-event bookkeeping (hash map of live
// pointers) any replay must pay.
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator/alloc_conf.h"
#include "allocator/allocation_trace.h"
#include "allocator/trace_replay.h"
#include "benchmark/benchmark.h"
#include "common/units.h"

namespace headroom {
namespace {

AllocationTrace TransformerTrace(int steps) {
  AllocationTrace trace{.source = "synthetic-transformer", .format = "synthetic", .events = {}};
  uint64_t next = 1;
  auto alloc = [&](uint64_t size) {
    trace.events.push_back({.op = TraceOp::kAllocate, .pointer = next, .size = size});
    return next++;
  };
  auto free = [&](uint64_t pointer) { trace.events.push_back({.op = TraceOp::kFree, .pointer = pointer}); };
  constexpr uint64_t kHidden = 4096, kHeads = 32, kLayers = 24, kBytes = 2;  // bf16
  for (uint64_t l = 0; l < kLayers; ++l) {
    alloc(3 * kHidden * kHidden * kBytes);  // qkv weights
    alloc(kHidden * kHidden * kBytes);      // output projection
    alloc(8 * kHidden * kHidden * kBytes);  // MLP up + down
    alloc(2 * kHidden * kBytes);            // norms
  }
  const uint64_t seqs[] = {1024, 1536, 2048, 1280, 1792, 896, 2048, 1152};
  std::vector<uint64_t> grads;
  for (int step = 0; step < steps; ++step) {
    const uint64_t tokens = seqs[step % 8] * 2;  // batch 2
    const uint64_t seq = seqs[step % 8];
    std::vector<std::vector<uint64_t>> saved(kLayers);
    for (uint64_t l = 0; l < kLayers; ++l) {
      saved[l].push_back(alloc(tokens * kHidden * kBytes));      // layer input (norm output)
      saved[l].push_back(alloc(3 * tokens * kHidden * kBytes));  // q, k, v
      const uint64_t scores = alloc(2 * kHeads * seq * seq * kBytes);
      saved[l].push_back(alloc(2 * kHeads * seq * seq * kBytes));  // softmax probabilities
      free(scores);
      saved[l].push_back(alloc(tokens * kHidden * kBytes));      // attention output
      saved[l].push_back(alloc(4 * tokens * kHidden * kBytes));  // MLP hidden
      const uint64_t gelu = alloc(4 * tokens * kHidden * kBytes);
      saved[l].push_back(gelu);
      saved[l].push_back(alloc(tokens * kHidden * kBytes));      // residual output
    }
    const uint64_t logits = alloc(tokens * 32000 * 4);  // fp32 logits
    free(logits);
    for (uint64_t l = kLayers; l-- > 0;) {
      const uint64_t grad_hidden = alloc(4 * tokens * kHidden * kBytes);
      const uint64_t grad_scores = alloc(2 * kHeads * seq * seq * kBytes);
      const uint64_t grad_in = alloc(tokens * kHidden * kBytes);
      if (step == 0) {
        for (uint64_t size : {3 * kHidden * kHidden, kHidden * kHidden, 8 * kHidden * kHidden}) {
          grads.push_back(alloc(size * kBytes));
        }
      }
      free(grad_scores);
      free(grad_hidden);
      for (auto it = saved[l].rbegin(); it != saved[l].rend(); ++it) free(*it);
      free(grad_in);
    }
  }
  return trace;
}

uint64_t PeakLive(const AllocationTrace& trace) {
  absl::flat_hash_map<uint64_t, uint64_t> live;
  uint64_t current = 0, peak = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.op == TraceOp::kAllocate) {
      live[e.pointer] = e.size;
      current += e.size;
      peak = std::max(peak, current);
    } else if (e.op == TraceOp::kFree) {
      current -= live[e.pointer];
      live.erase(e.pointer);
    }
  }
  return peak;
}

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
