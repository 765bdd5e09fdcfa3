// The chain-dp strategy: the cheapest single-replay checkpoint plan of a
// chain (planner/chain.h) within a memory budget, by dynamic programming
// over the stages with memory discretized in a stated unit, and its
// translation into the CheckpointPlan the step builder runs.
//
//   Chain chain = *ExtractLayerChain(*problem.step, problem.op_cost, problem.profile);
//   HEADROOM_ASSIGN_OR_RETURN(ChainPlan plan, SolveChainDp(chain, {.budget = 20 * kGiB}));
//   plan.choice[3];        // kKeepAll, kSelective or kCheckpoint
//   plan.segments;         // the checkpointed runs of stages, {first, last}
//   plan.memory_unit;      // bytes per DP memory slot
//   HEADROOM_ASSIGN_OR_RETURN(CheckpointPlan cp, ChainPlanToCheckpointPlan(*problem.step, plan));
//   HEADROOM_ASSIGN_OR_RETURN(Schedule schedule, SegmentSchedule(*problem.step, cp));
//
// Note [Single-replay plans]
// Plans map one to one onto what users run: each stage is kept whole,
// selective (Korthikanti et al. 2022's selective recomputation of the
// attention core), or in a checkpointed segment (torch.utils.checkpoint
// around a run of consecutive layers, Megatron's --recompute-num-layers k),
// replayed once during backward. Rotor (Beaumont et al. 2019, "Optimal
// checkpointing for heterogeneous chains") also allows nested multi-level
// schedules, which replay some stages several times and which no framework
// runs as configured; they are not in this plan space. Within it the DP is
// exactly optimal for the discretized model, and BruteForceChainPlan checks
// that on small chains.
//
// Note [Chain DP]
// Memory is counted in units of memory_unit bytes above fixed_bytes: every
// byte figure of the chain rounds UP to whole units and the budget less
// fixed_bytes rounds down to M = memory_slots units, so a plan that fits in
// units fits in bytes (predicted_peak <= budget), but a plan fitting within
// less than a unit per figure held may be missed; a smaller unit closes the
// gap at proportional cost. D[i][u] is the least replay cost of stages
// i..L-1 when stages 0..i-1 hold u units (Note [Chain memory model]):
//   D[L][u]  = 0 if u + tail <= M
//   D[i][u]  = min( D[i+1][u + all_i]                  if u + all_i + bwd_i <= M,
//                   sel_cost_i + D[i+1][u + sel_i]     if core, u + all_i + bwd_i <= M,
//                   min over k of  replay(i..k) + D[k+1][u + in_i]
//                                  if u + max_{m<=k}(all(i..m) + bwd_m) <= M )
// The budget must also cover fixed_bytes and outside_peak_bytes, which are
// checked first.
// The segment term reads D[k+1] at the same column u + in_i for every k; the
// feasible k form a range [i, K(i, u)] (a longer segment only needs more);
// and replay(i..k) = R(k+1) - boundary_k - R(i) for the prefix sums R of
// forward and boundary costs. So it is a range minimum of
//   G[k'][v] = D[k'][v] + R(k') - boundary_{k'-1}  over k' in [i+1, K+1].
// Keeping, per column v, the rows whose G is below that of every row before
// them (a monotonic stack, amortized O(1) per row) answers each query by a
// galloping search from the newest rows: O(L * M * log L) time, O(L * M)
// 4-byte decisions for the plan and O(M) rows; the feasible ranges add
// O(sum of their lengths).
#ifndef HEADROOM_PLANNER_CHAIN_DP_H_
#define HEADROOM_PLANNER_CHAIN_DP_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/checkpoint_plan.h"
#include "graph/graph.h"
#include "planner/chain.h"

namespace headroom {

enum class StageChoice : uint8_t {
  kKeepAll,     // every saved tensor stays until the stage's backward
  kSelective,   // the attention core is replayed before the stage's backward
  kCheckpoint,  // in a checkpointed segment (ChainPlan::segments)
};
std::string_view StageChoiceName(StageChoice choice);  // "all", "selective", "checkpoint"

// Stages first..last (inclusive) of a chain, replayed together.
struct ChainSegment {
  int first = 0;
  int last = 0;

  friend bool operator==(const ChainSegment&, const ChainSegment&) = default;
};

struct ChainPlan {
  std::vector<StageChoice> choice;     // one per stage
  std::vector<ChainSegment> segments;  // the kCheckpoint stages, in order, as segments
  double extra_cost = 0;               // replays, in the chain's cost unit
  uint64_t predicted_peak = 0;         // exact bytes under Note [Chain memory model]
  uint64_t memory_unit = 1;            // bytes per DP memory unit (Note [Chain DP]); 1: exact
  int64_t memory_slots = 0;            // M, the budget's units above fixed_bytes (0: not a DP plan)

  // InvalidArgument naming the stage or segment: a choice per stage of
  // `chain`, kSelective only where a stage has an attention core, and
  // segments ordered, disjoint, covering exactly the kCheckpoint stages.
  absl::Status Validate(const Chain& chain) const;
};

struct ChainDpOptions {
  uint64_t budget = 0;  // bytes, as PlanProblem::budget
  // Units the budget above fixed_bytes is divided into; the unit is
  // ceil((budget - fixed_bytes) / memory_slots). 0: AutoMemorySlots.
  int64_t memory_slots = 0;
  // Bytes per unit, overriding memory_slots when non-zero; 1 is exact.
  uint64_t memory_unit = 0;
};

// Largest DP table: L x (M + 1) decisions of 4 bytes (512 MiB).
inline constexpr uint64_t kMaxChainDpCells = uint64_t{1} << 27;

// The default slots for `num_stages` stages: 8 per stage and at least 4,096,
// within kMaxChainDpCells. Rounding every figure up costs plans roughly in
// proportion to stages / slots (Note [Chain DP]; bench/planner_bench.cc
// measures it: at 1,000 stages and half the store-all peak, 8 units per
// stage replay about a quarter more than the exact model's plan, 32 about a
// twentieth more), and time grows with slots; 8 per stage keeps 1,000
// stages near a tenth of a second. From about 11,600 stages on, the table
// bound leaves under one unit per stage and rounding dominates the plans.
int64_t AutoMemorySlots(int num_stages);

// The replay cost and model peak of a plan: Note [Chain memory model] with
// every byte figure rounded up to `memory_unit` (1: exact bytes).
struct ChainPlanCost {
  double extra_cost = 0;
  uint64_t peak_bytes = 0;
};
absl::StatusOr<ChainPlanCost> EvaluateChainPlan(const Chain& chain, const ChainPlan& plan,
                                                uint64_t memory_unit = 1);

// The smallest peak any plan reaches under the model at `memory_unit`: the
// least budget for which SolveChainDp can succeed at that unit. O(L^2) at
// worst, far less when long segments need more than short ones.
absl::StatusOr<uint64_t> MinimumChainPeak(const Chain& chain, uint64_t memory_unit = 1);

// The cheapest plan whose peak fits options.budget (Note [Chain DP]); ties
// go to keeping, then selective, then the shortest segment. Errors
// (InvalidArgument): an invalid chain; memory_slots negative; a table beyond
// kMaxChainDpCells (naming memory_slots or memory_unit); a budget below the
// smallest peak of the model, naming that peak, or one that only rounding
// to the unit rules out, naming the smallest budget at that unit.
absl::StatusOr<ChainPlan> SolveChainDp(const Chain& chain, const ChainDpOptions& options);

// The same problem by enumerating every plan, in the same discretization
// (the unit options resolve to), for checking SolveChainDp. At most
// kMaxBruteForceStages stages (4^L plans); same errors otherwise.
inline constexpr int kMaxBruteForceStages = 12;
absl::StatusOr<ChainPlan> BruteForceChainPlan(const Chain& chain, const ChainDpOptions& options);

// A plan making `choice` for every stage, each checkpointed stage its own
// segment (PlanForMode's kFull), selective falling back to kKeepAll where a
// stage has no core (kSelective); priced and measured exactly.
ChainPlan UniformChainPlan(const Chain& chain, StageChoice choice);

// The plan over the forward ops of a forward graph or a step (indexed by its
// OpId, as SegmentSchedule takes it), as PlanForMode makes its modes
// (planner/checkpoint_mode_plan.h): a segment per checkpointed run of layers, one
// per contiguous run of attention-core ops of a selective layer; stage i is
// layer i. InvalidArgument when the plan's stages are not the graph's layers.
absl::StatusOr<CheckpointPlan> ChainPlanToCheckpointPlan(const Graph& forward_or_step, const ChainPlan& plan);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_CHAIN_DP_H_
