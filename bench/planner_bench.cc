// The chain-dp strategy (planner/chain_dp.h) on heterogeneous random chains
// (RandomChain, seed 42) of 100, 1,000 and 10,000 stages, at budgets of 90,
// 80, 70 and 50% of the peak that keeps everything. The target:
// 1,000 stages in well under one second.
//
// Counters, each relative to the chain's forward cost (one forward pass):
//  - extra: the DP plan's replay cost;
//  - every_stage, selective: the plans users reach for, baselines of the
//    same run: checkpointing every stage alone (PlanForMode's kFull, which
//    replays the forward but the stages' outputs) and selective recomputation wherever a
//    stage has an attention core; *_fits says whether each fits the budget;
//  - exact_extra: the DP at a 1 MiB unit, which is exact for RandomChain (its
//    figures are whole MiB), where that table stays within kMaxChainDpCells;
//    extra - exact_extra is what rounding to the default unit costs;
//  - units_per_stage: the budget's units per stage; near or below one,
//    rounding every held figure up to a whole unit dominates (Note [Chain DP]).
// The timing baseline of the same run is evaluating one plan
// (BM_Baseline_EvaluateStoreAll), the O(L) floor of any strategy.
//
// 10,000 stages: AutoMemorySlots gives the table bound's 13,421 slots, 1.3
// units per stage, which takes seconds, and rounding every held figure up
// to a whole unit costs so much that at 80 and 70% selective recomputation
// everywhere (which fits) replays less than the DP's plan; at 4,096 slots
// (BM_ChainDp_10kStages4096Slots) it takes about one second and replays
// about half the forward. The target is not met at 10,000 stages; the
// counters show by how much.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "common/units.h"
#include "planner/chain.h"
#include "planner/chain_dp.h"

namespace headroom {
namespace {

double ForwardCost(const Chain& chain) {
  double total = 0;
  for (const ChainStage& s : chain.stages) total += s.forward_cost + s.boundary_cost;
  return total;
}

uint64_t BudgetAt(const Chain& chain, int64_t percent) {
  const uint64_t all = UniformChainPlan(chain, StageChoice::kKeepAll).predicted_peak;
  return static_cast<uint64_t>(static_cast<double>(all) * static_cast<double>(percent) / 100);
}

// Runs the DP at range(0) stages and range(1) percent of the store-all peak,
// with `slots` memory slots.
void RunChainDp(benchmark::State& state, int64_t slots) {
  const Chain chain = RandomChain(static_cast<int>(state.range(0)), /*seed=*/42);
  const uint64_t budget = BudgetAt(chain, state.range(1));
  const ChainDpOptions options{.budget = budget, .memory_slots = slots};
  absl::StatusOr<ChainPlan> plan;
  for (auto _ : state) {
    plan = SolveChainDp(chain, options);
    benchmark::DoNotOptimize(plan);
  }
  if (!plan.ok()) {
    state.SkipWithError(std::string(plan.status().message()).c_str());
    return;
  }
  const double forward = ForwardCost(chain);
  const ChainPlan every = UniformChainPlan(chain, StageChoice::kCheckpoint);
  state.counters["extra"] = plan->extra_cost / forward;
  state.counters["every_stage"] = every.extra_cost / forward;
  state.counters["every_stage_fits"] = every.predicted_peak <= budget ? 1 : 0;
  const ChainPlan selective = UniformChainPlan(chain, StageChoice::kSelective);
  state.counters["selective"] = selective.extra_cost / forward;
  state.counters["selective_fits"] = selective.predicted_peak <= budget ? 1 : 0;
  state.counters["units_per_stage"] =
      static_cast<double>(plan->memory_slots) / static_cast<double>(chain.num_stages());
  absl::StatusOr<ChainPlan> exact = SolveChainDp(chain, {.budget = budget, .memory_unit = kMiB});
  if (exact.ok()) state.counters["exact_extra"] = exact->extra_cost / forward;
  state.SetLabel(absl::StrFormat("unit %s, %d slots%s", FormatBytes(plan->memory_unit), plan->memory_slots,
                                 exact.ok() ? "" : ", exact run beyond the table bound"));
}

void BM_ChainDp(benchmark::State& state) { RunChainDp(state, ChainDpOptions{}.memory_slots); }
BENCHMARK(BM_ChainDp)
    ->ArgsProduct({{100, 1000, 10000}, {90, 80, 70, 50}})
    ->ArgNames({"stages", "budget_pct"})
    ->Unit(benchmark::kMillisecond);

// The price of rounding: 1,000 stages at memory_slots from 1,024 to 32,768
// (range(2)); exact_extra is the same in every row.
void BM_ChainDp_Slots(benchmark::State& state) { RunChainDp(state, state.range(2)); }
BENCHMARK(BM_ChainDp_Slots)
    ->ArgsProduct({{1000}, {80, 50}, {1024, 2048, 4096, 8192, 16384, 32768}})
    ->ArgNames({"stages", "budget_pct", "slots"})
    ->Unit(benchmark::kMillisecond);

// 10,000 stages at 4,096 slots: faster than AutoMemorySlots' table-bound
// 13,421, with coarser plans.
void BM_ChainDp_10kStages4096Slots(benchmark::State& state) { RunChainDp(state, 4096); }
BENCHMARK(BM_ChainDp_10kStages4096Slots)
    ->ArgsProduct({{10000}, {90, 50}})
    ->ArgNames({"stages", "budget_pct"})
    ->Unit(benchmark::kMillisecond);

// Baseline: pricing and measuring one plan (the store-all one) exactly.
void BM_Baseline_EvaluateStoreAll(benchmark::State& state) {
  const Chain chain = RandomChain(static_cast<int>(state.range(0)), /*seed=*/42);
  const ChainPlan plan = UniformChainPlan(chain, StageChoice::kKeepAll);
  for (auto _ : state) benchmark::DoNotOptimize(EvaluateChainPlan(chain, plan));
}
BENCHMARK(BM_Baseline_EvaluateStoreAll)->Arg(100)->Arg(1000)->Arg(10000)->ArgName("stages");

}  // namespace
}  // namespace headroom
