// The planner's front door: run one named strategy over a plan problem and
// get the schedule with its evaluation, or run them all to compare.
//
//   absl::StatusOr<PlanResult> r = RunStrategy(problem, Strategy::kChenGreedy);
//   r->evaluation.peak_bytes; r->evaluation.extra_cost; r->fits;
//   std::vector<absl::StatusOr<PlanResult>> all = CompareStrategies(problem);
//
// Note [Strategies]
//  - store-all: nothing replayed or copied; the baseline every overhead is
//    measured against.
//  - sqrt-n: ~sqrt(n) segments cut at the narrowest points of the forward
//    graph (planner/chen.h); sqrt-n-linear cuts anywhere, keeping whatever
//    crosses a cut (Chen et al.'s linearized variant for non-chains).
//  - chen-greedy: Chen et al.'s greedy under the budget (planner/chen.h).
//  - optimal: replays chosen over the whole DAG, near Checkmate's MILP
//    optimum in seconds, with an LP lower bound on the extra cost
//    (planner/remat_solver.h, PlanRemat).
//  - chain-dp: for layer stacks, each layer kept, selective or in a
//    checkpointed segment, the cheapest such plan by dynamic programming
//    (planner/chain_dp.h); what torch.utils.checkpoint and Megatron run.
//  - offload: saved activations to pinned host memory after their last
//    forward use and back before their backward use, overlapped with
//    compute (planner/offload.h, PlanOffload).
//  - hybrid: keep, replay or offload per saved tensor, the least step time
//    (planner/offload.h, PlanHybrid).
// A strategy that does not take the budget into account (store-all,
// sqrt-n) still returns its plan; `fits` says whether it meets the budget.
#ifndef HEADROOM_PLANNER_PLANNER_H_
#define HEADROOM_PLANNER_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "planner/selective_checkpoint.h"

namespace headroom {

enum class Strategy : uint8_t {
  kStoreAll,
  kSqrtN,
  kSqrtNLinear,
  kChenGreedy,
  kChainDp,
  kOptimal,
  kOffload,
  kHybrid,
};
std::string_view StrategyName(Strategy strategy);  // "store-all", "sqrt-n", ...
absl::StatusOr<Strategy> ParseStrategy(std::string_view name);
std::vector<Strategy> AllStrategies();  // in the order --compare lists them

struct PlanResult {
  Strategy strategy = Strategy::kStoreAll;
  Schedule schedule;
  PlanEvaluation evaluation;
  bool fits = false;  // evaluation.peak_bytes <= problem.budget
  // A lower bound on the extra cost any plan in the problem's schedule space
  // needs to fit the budget, when the strategy proves one.
  std::optional<double> lower_bound_extra_cost;
  std::string detail;  // what the strategy chose, in a few words ("4 segments")
  // With PlanRunner::kTorchSelectiveCheckpoint: the checkpointed regions and
  // their policies, and the offloads saved-tensor hooks carry, which
  // `schedule` realizes.
  std::vector<CheckpointRegion> regions;
  std::vector<HookedOffload> offloads;
};

// Runs `strategy` and evaluates its schedule. Errors: an invalid problem
// (InvalidArgument), or ResourceExhausted from a budget-driven strategy that
// cannot meet the budget, naming the smallest peak it reached.
absl::StatusOr<PlanResult> RunStrategy(const PlanProblem& problem, Strategy strategy);

// The lowest peak `strategy` reaches on `problem`, whatever its budget: the
// plan's peak for strategies that ignore the budget, the least over the
// plans a budget-driven strategy searches. What an error for a budget that
// no strategy meets states.
absl::StatusOr<uint64_t> SmallestPeak(const PlanProblem& problem, Strategy strategy);

// SmallestPeak of every strategy in `strategies`, in that order, each
// search run once: the optimal strategy beyond its solvers takes the least
// of its starts' (chen-greedy, chain-dp, sqrt-n) from their own entries
// rather than searching them again. What the CLI's error for a budget no
// plan meets computes.
std::vector<absl::StatusOr<uint64_t>> SmallestPeaks(const PlanProblem& problem,
                                                    const std::vector<Strategy>& strategies);

// Note [Automatic strategy]
// What `headroom plan` runs unless told a strategy: hybrid, whose plan is
// never slower than offload alone, replay alone or per-layer checkpointing,
// when it fits and the plan runs as scheduled; otherwise (it does not fit,
// or a runner realizes plans its own way, and realizations differ) every
// strategy, and the plan that fits with the least step time (ties: the lower
// peak). So the default never fails where any strategy fits. The detail
// says which was chosen and why. ResourceExhausted when none fits.
absl::StatusOr<PlanResult> RunAutomaticStrategy(const PlanProblem& problem);

// Whether `strategy` makes schedules of computes and replays only (no copies
// to host), the space the optimal strategy's LP bound covers.
bool IsReplayOnly(Strategy strategy);

// Every strategy on one problem, in AllStrategies() order. The optimal
// strategy's lower bound, when it has one, is given to every replay-only
// plan that fits.
std::vector<absl::StatusOr<PlanResult>> CompareStrategies(const PlanProblem& problem);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_PLANNER_H_
