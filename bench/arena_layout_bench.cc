// The static activation-arena layout (layout/arena_layout.h) on training
// steps and on synthetic lifetimes, up to 100k tensors. Baselines in the
// same run: ProfileMemory on the same step (the liveness pass the layout
// starts from), and the paper's quadratic loop (every placed tensor scanned
// for each new one) on the same requests. Counters: the arena, the aligned
// live-bytes bound and the no-reuse sum, in MiB.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "graph/liveness.h"
#include "graph/training_step.h"
#include "layout/arena_layout.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/checkpoint_mode_plan.h"

namespace headroom {
namespace {

// A Llama-2-7B-shaped step (hidden 4096, flash attention) at sequence 4096
// with `layers` layers: about 45 tensors per layer without checkpointing,
// 62 with full checkpointing.
const Graph& LlamaStep(int64_t layers, CheckpointMode mode) {
  static std::map<std::pair<int64_t, CheckpointMode>, Graph> cache;
  auto it = cache.find({layers, mode});
  if (it != cache.end()) return it->second;
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("llama-2-7b");
  if (!config.ok()) std::abort();
  config->num_layers = layers;
  absl::StatusOr<Graph> forward = BuildModelGraph(
      *config, {.batch = 1, .seq_len = 4096, .param_dtype = DType::kBF16,
                .compute_dtype = DType::kBF16, .attention = AttentionImpl::kFlash});
  if (!forward.ok()) std::abort();
  absl::StatusOr<CheckpointPlan> plan = PlanForMode(*forward, mode);
  if (!plan.ok()) std::abort();
  absl::StatusOr<Graph> step = BuildTrainingStep(*forward, {.checkpoint = *std::move(plan)});
  if (!step.ok()) std::abort();
  return cache.emplace(std::make_pair(layers, mode), *std::move(step)).first->second;
}

std::vector<ArenaRequest> StepRequests(const Graph& step) {
  const std::vector<TensorLifetime> life = ComputeLifetimes(step);
  std::vector<ArenaRequest> requests;
  for (const Tensor& t : step.tensors()) {
    const TensorLifetime& l = life[static_cast<size_t>(t.id)];
    if (l.first <= l.last) requests.push_back({.id = t.id, .first = l.first, .last = l.last, .bytes = t.bytes()});
  }
  return requests;
}

// Nested forward-to-backward lifetimes (half of all tensors live at the
// middle op), short temporaries and arbitrary spans, over 20k ops.
std::vector<ArenaRequest> RandomRequests(size_t n) {
  std::mt19937_64 rng(7);
  const OpId ops = 20000;
  std::vector<ArenaRequest> requests;
  for (size_t i = 0; i < n; ++i) {
    ArenaRequest r{.id = static_cast<int32_t>(i)};
    const auto at = static_cast<OpId>(rng() % ops);
    const uint64_t kind = rng() % 10;
    if (kind < 4) {
      r.first = at;
      r.last = std::min<OpId>(ops - 1, at + static_cast<OpId>(rng() % 4));
    } else if (kind < 9) {
      r.first = at / 2;
      r.last = ops - 1 - r.first;
    } else {
      r.first = at;
      r.last = at + static_cast<OpId>(rng() % static_cast<uint64_t>(ops - at));
    }
    r.bytes = (uint64_t{1} << (10 + rng() % 16)) + rng() % 4096;
    requests.push_back(r);
  }
  return requests;
}

// The paper's loop (Pisarchyk & Lee 2020, greedy by size, best fit): each
// tensor scans every placed one, in offset order. O(n^2).
uint64_t QuadraticArenaBytes(const std::vector<ArenaRequest>& requests) {
  const size_t n = requests.size();
  std::vector<uint64_t> size(n), offset(n, 0);
  for (size_t i = 0; i < n; ++i) size[i] = (requests[i].bytes + 511) / 512 * 512;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return size[a] != size[b] ? size[a] > size[b] : requests[a].first < requests[b].first;
  });
  std::vector<size_t> placed;
  uint64_t arena = 0;
  for (size_t i : order) {
    uint64_t prev_end = 0, best_gap = std::numeric_limits<uint64_t>::max(), best = 0;
    bool found = false;
    for (size_t j : placed) {
      if (requests[j].last < requests[i].first || requests[i].last < requests[j].first) continue;
      if (offset[j] >= prev_end && offset[j] - prev_end >= size[i] && offset[j] - prev_end < best_gap) {
        best_gap = offset[j] - prev_end;
        best = prev_end;
        found = true;
      }
      prev_end = std::max(prev_end, offset[j] + size[j]);
    }
    offset[i] = found ? best : prev_end;
    arena = std::max(arena, offset[i] + size[i]);
    placed.insert(std::upper_bound(placed.begin(), placed.end(), i,
                                   [&](size_t a, size_t b) { return offset[a] < offset[b]; }),
                  i);
  }
  return arena;
}

void Report(benchmark::State& state, const std::vector<ArenaRequest>& requests) {
  absl::StatusOr<ArenaLayout> layout = LayoutArena(requests);
  if (!layout.ok()) std::abort();
  state.counters["tensors"] = static_cast<double>(requests.size());
  state.counters["arena_MiB"] = static_cast<double>(layout->arena_bytes) / (1 << 20);
  state.counters["bound_MiB"] = static_cast<double>(layout->lower_bound_bytes) / (1 << 20);
  state.counters["naive_MiB"] = static_cast<double>(layout->naive_bytes) / (1 << 20);
}

// Arguments: layers of the Llama-shaped step, and the checkpoint mode.
void StepArgs(benchmark::internal::Benchmark* b) {
  b->Args({32, static_cast<int>(CheckpointMode::kOff)});     // Llama-2-7B itself: 1.5k tensors
  b->Args({2300, static_cast<int>(CheckpointMode::kOff)});   // 104k tensors
  b->Args({1600, static_cast<int>(CheckpointMode::kFull)});  // 99k tensors, recompute ops
}

void BM_StepLayout(benchmark::State& state) {
  const Graph& step = LlamaStep(state.range(0), static_cast<CheckpointMode>(state.range(1)));
  for (auto _ : state) {
    absl::StatusOr<ArenaLayout> layout = LayoutActivationArena(step);
    benchmark::DoNotOptimize(layout->arena_bytes);
  }
  Report(state, StepRequests(step));
}
BENCHMARK(BM_StepLayout)->Apply(StepArgs)->Unit(benchmark::kMillisecond);

// Baseline: the liveness pass over the same step.
void BM_StepProfileMemory(benchmark::State& state) {
  const Graph& step = LlamaStep(state.range(0), static_cast<CheckpointMode>(state.range(1)));
  for (auto _ : state) benchmark::DoNotOptimize(ProfileMemory(step).peak_bytes);
}
BENCHMARK(BM_StepProfileMemory)->Apply(StepArgs)->Unit(benchmark::kMillisecond);

// Baseline: the paper's loop over the same requests (once: it takes seconds at 100k).
void BM_StepQuadratic(benchmark::State& state) {
  const std::vector<ArenaRequest> requests =
      StepRequests(LlamaStep(state.range(0), static_cast<CheckpointMode>(state.range(1))));
  for (auto _ : state) benchmark::DoNotOptimize(QuadraticArenaBytes(requests));
}
BENCHMARK(BM_StepQuadratic)->Apply(StepArgs)->Iterations(1)->Unit(benchmark::kMillisecond);

void BM_RandomLayout(benchmark::State& state) {
  const std::vector<ArenaRequest> requests = RandomRequests(static_cast<size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(LayoutArena(requests)->arena_bytes);
  Report(state, requests);
}
BENCHMARK(BM_RandomLayout)->Arg(10'000)->Arg(100'000)->Unit(benchmark::kMillisecond);

void BM_RandomQuadratic(benchmark::State& state) {
  const std::vector<ArenaRequest> requests = RandomRequests(static_cast<size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(QuadraticArenaBytes(requests));
}
BENCHMARK(BM_RandomQuadratic)->Arg(10'000)->Arg(100'000)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace headroom
